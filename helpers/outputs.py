"""Where the notebooks write their figures and CSVs: never into notebooks/ (notebooks 00-04)."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "SLM_OUTPUT_DIR"


def repository_root() -> Path | None:
    """The course checkout this package was installed from (editable install), if any."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "notebooks").is_dir() and (root / "pyproject.toml").is_file() else None


def output_dir(path: str | os.PathLike | None = None) -> Path:
    """The folder for figures and CSVs, created if missing: ``path`` if given, else ``$SLM_OUTPUT_DIR``, else
    ``runs/`` at the root of the course checkout (the one this package runs from, else the one around the working
    directory: a kernel started in notebooks/ with the package installed as a copy), else ``runs/`` here."""
    chosen = path or os.environ.get(ENV)
    if chosen is None:
        here = Path.cwd().resolve()
        clones = (p for p in (here, *here.parents) if (p / "helpers" / "scoring.py").is_file())
        around = next((p for p in clones if (p / "notebooks").is_dir()), None)
        chosen = (repository_root() or around or here) / "runs"
    folder = Path(chosen).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    return folder
