"""The committed reference run: every notebook executed once, with its figures, for readers who only read.

``make reference`` runs ``python -m helpers.executed reference-run``: each lesson and solutions notebook is executed
with papermill under the workshop preset (``helpers.lessons``: the embedded model and the sizes every attendee's
run gets; figures and CSVs into the same folder), stamped with a first cell that names
the machine it ran on, and listed in the folder's README with its wall time. ``code_cells`` is what
the tests compare with the source notebooks, so a reference copy cannot drift from the lesson it shows.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_TAGS = {"parameters", "injected-parameters"}  # parameter cells may differ: papermill injects its own
PRESET = "workshop"  # helpers.lessons: what an instructor tells the room to expect


def notebook_format():
    """nbformat, imported when a notebook is read or written: a package install for ``classify`` or ``bench``
    runs without the notebook tools (requirements.txt installs them)."""
    try:
        import nbformat
    except ImportError:
        raise RuntimeError("reading and writing notebooks needs nbformat, which is not installed: "
                           "pip install nbformat (or pip install -r requirements.txt)") from None
    return nbformat


def sources(root: Path = ROOT) -> list[Path]:
    """The notebooks of the course, lessons first, then their worked solutions."""
    notebooks = root / "notebooks"
    return sorted(notebooks.glob("[0-9][0-9]_*.ipynb")) + sorted((notebooks / "solutions").glob("[0-9][0-9]_*.ipynb"))


def code_cells(path: Path) -> list[str]:
    """A notebook's code, cell by cell, without its parameter cells."""
    cells = notebook_format().read(path, as_version=4).cells
    return [cell.source for cell in cells
            if cell.cell_type == "code" and not SKIPPED_TAGS & set(cell.metadata.get("tags", []))]


def copy_of(source: Path, folder: Path, root: Path = ROOT) -> Path:
    """Where the executed copy of a source notebook lives in the reference folder (same layout as notebooks/)."""
    return folder / source.relative_to(root / "notebooks")


def machine_line() -> str:
    import platform

    import torch
    import transformers

    from .models import cpu_threads

    from .models import pick_device
    from .models import machine_name

    device = pick_device()
    return (f"{machine_name(device)}, {cpu_threads()} thread(s), {platform.system()} · torch {torch.__version__} · "
            f"transformers {transformers.__version__}")


def stamp(path: Path, machine: str, seconds: float, source: Path) -> None:
    """Put a first markdown cell on an executed copy: what it is, where it ran, how to regenerate it."""
    nbformat = notebook_format()
    notebook = nbformat.read(path, as_version=4)
    link = os.path.relpath(source, path.parent)
    notebook.cells.insert(0, nbformat.v4.new_markdown_cell(
        f"> **Reference run, not your results.** Executed on {machine}, "
        f"{datetime.date.today().isoformat()}, in {seconds:.0f} s, with `make reference` (the workshop preset: the "
        f"embedded model, fixed sizes). Every number and figure below is that machine's; run [the source "
        f"notebook]({link}) to get yours (`SLM_PRESET=workshop` for the same sizes)."))
    nbformat.write(notebook, path)


def _table_rows(readme: Path) -> dict[str, str]:
    """The README's notebook rows, keyed by link target (empty when there is no README yet)."""
    rows = {}
    if readme.is_file():
        for line in readme.read_text().splitlines():
            if line.startswith("| [") and "](" in line:
                rows[line.split("](", 1)[1].split(")", 1)[0]] = line
    return rows


def run(folder: Path, notebooks: list[Path] | None = None) -> list[tuple[Path, float]]:
    """Execute every notebook (or only ``notebooks``) into ``folder`` (figures and CSVs too), stamp each, and write
    the folder's README: one row per notebook with its wall time and date; the rows of notebooks not rerun stay."""
    import papermill

    folder = Path(folder).resolve()
    machine = machine_line()
    today = datetime.date.today().isoformat()
    readme = folder / "README.md"
    rows = _table_rows(readme) if notebooks else {}
    # Rows from a README written before rows carried dates: the date it gave for the whole run.
    earlier = readme.read_text().split("**Date:** ", 1)[1].split(".", 1)[0] if notebooks and readme.is_file() and \
        "**Date:** " in readme.read_text() else ""
    timings = []
    # A saved progress bar is a widget whose saved view is its first frame (0 %): in copies made for reading, the
    # kernels run without bars (tqdm's and the hub's), and each cell's printed result says what it did.
    quiet = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    saved = {name: os.environ.get(name) for name in quiet}
    for source in notebooks or sources():
        target = copy_of(source, folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"== {source.relative_to(ROOT)}", flush=True)
        start = time.perf_counter()
        from .lessons import papermill_parameters  # a lesson takes what it does not declare in OPTIONS

        parameters = papermill_parameters(papermill.inspect_notebook(str(source)),
                                          {"OUTPUT_DIR": str(target.parent), "PRESET": PRESET})
        os.environ.update(quiet)  # the kernel inherits this process's environment
        try:
            papermill.execute_notebook(str(source), str(target), parameters=parameters,
                                       cwd=str(target.parent), progress_bar=False, kernel_name="python3")
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        seconds = time.perf_counter() - start
        stamp(target, machine, seconds, source)
        timings.append((target, seconds))
        link = target.relative_to(folder).as_posix()
        rows[link] = f"| [{link}]({link}) | {seconds:.0f} s | {today} |"
    table = "\n".join(row if row.count("|") == 4 else f"{row} {earlier} |" for _, row in sorted(rows.items()))
    readme.write_text(
        f"# Reference run\n\nThe course's notebooks executed once, with their outputs and figures, for reading without "
        f"running. **Machine:** {machine} (each notebook's first cell names the machine it ran on). Regenerate with "
        f"`make reference`, or one notebook with `python -m helpers.executed reference-run --only 01`; the tests fail "
        f"when a copy's code no longer matches its source notebook.\n\n"
        f"Every number here is that machine's. It ran under the workshop preset (`SLM_PRESET=workshop`, `make "
        f"workshop`): the embedded model and the same ticket counts and batch sizes on every machine, so a room of "
        f"attendees running that preset sees these sizes, with their own machines' speeds. Without it the "
        f"notebooks size their work to the machine they run on.\n\n| notebook | wall time | executed |\n|---|---|---|\n"
        f"{table}\n")
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "reference-run"))
    parser.add_argument("--only", nargs="+", metavar="NN", default=None,
                        help="rerun only these lessons and their solutions (e.g. --only 01 03); other rows stay")
    args = parser.parse_args()
    chosen = None
    if args.only:
        numbers = [number.zfill(2) for number in args.only]
        chosen = [path for path in sources() if path.name[:2] in numbers]
        missing = [number for number in numbers if not any(path.name[:2] == number for path in chosen)]
        if missing:
            parser.error(f"no notebook numbered {', '.join(missing)}")
    run(Path(args.folder), chosen)


if __name__ == "__main__":
    main()
