"""The committed reference run (``make reference``): every notebook executed once with papermill on the embedded model,
with its figures, stamped with the machine and listed with its wall time in the folder's README. The tests compare
``code_cells`` of each copy with its source notebook, so a reference copy cannot drift from the lesson it shows."""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import time
from pathlib import Path
from unittest import mock

import nbformat  # the course's tools run in the course folder, where requirements.txt installs it

ROOT = Path(__file__).resolve().parent.parent
WIDGET = "application/vnd.jupyter.widget-view+json"
SKIPPED_TAGS = {"parameters", "injected-parameters"}  # parameter cells may differ: papermill injects its own
PARAMETERS = {"MODEL": "embedded", "SCALE": "default"}  # the same model and sizes on every machine


def sources(root: Path = ROOT) -> list[Path]:
    """The notebooks of the course, lessons first, then their worked solutions."""
    notebooks = root / "notebooks"
    return sorted(notebooks.glob("[0-9][0-9]_*.ipynb")) + sorted((notebooks / "solutions").glob("[0-9][0-9]_*.ipynb"))


def code_cells(path: Path) -> list[str]:
    """A notebook's code, cell by cell, without its parameter cells."""
    cells = nbformat.read(path, as_version=4).cells
    return [c.source for c in cells if c.cell_type == "code" and not SKIPPED_TAGS & set(c.metadata.get("tags", []))]


def copy_of(source: Path, folder: Path, root: Path = ROOT) -> Path:
    """Where the executed copy of a source notebook lives in the reference folder (same layout as notebooks/)."""
    return folder / source.relative_to(root / "notebooks")


def machine_line() -> str:
    """The machine, by what tells machines apart: a CPU's brand is shared by machines of several speeds, its matmul
    GFLOP/s per dtype (notebook 00's profile of the embedded model, cached: measured here once if missing) are not."""
    import torch
    import transformers

    from helpers.models import cpu_threads, load_model, machine_name, pick_device
    from helpers.profile import machine_profile

    model, _, info = load_model(PARAMETERS["MODEL"], dtype="float32", verbose=False)
    gflops = machine_profile(model, info, verbose=False).matmul_gflops
    rates = ", ".join(f"{dtype} {rate:.0f}" for dtype, rate in gflops.items())
    matmul = f"matmul GFLOP/s (notebook 00, section 2): {rates}"
    versions = f"torch {torch.__version__} · transformers {transformers.__version__}"
    return f"{machine_name(pick_device())}, {cpu_threads()} thread(s), {matmul}, {platform.system()} · {versions}"


def stamp(path: Path, machine: str, seconds: float, source: Path) -> None:
    """Put a first markdown cell on an executed copy: what it is, where it ran, how to regenerate it."""
    notebook = nbformat.read(path, as_version=4)
    link = os.path.relpath(source, path.parent)
    text = (
        f"> **Reference run, not your results:** {machine}, {datetime.date.today().isoformat()}, {seconds:.0f} s to "
        f'run (`make reference`: the embedded model, `SCALE="default"`). Run [the source notebook]({link}) for yours.'
    )
    notebook.cells.insert(0, nbformat.v4.new_markdown_cell(text))
    for cell in notebook.cells:  # papermill's parameters cell is the run's bookkeeping: collapsed, as the setup cell
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        if cell.cell_type == "code":  # a saved progress bar is a widget whose saved view is its first frame, 0 %
            cell.outputs = [out for out in cell.outputs if WIDGET not in out.get("data", {})]
    nbformat.write(notebook, path)


def _table_rows(readme: Path) -> dict[str, str]:
    """The README's notebook rows, keyed by link target (empty when there is no README yet)."""
    lines = readme.read_text().splitlines() if readme.is_file() else []
    return {line.split("](", 1)[1].split(")", 1)[0]: line for line in lines if line.startswith("| [") and "](" in line}


def run(folder: Path, notebooks: list[Path] | None = None) -> list[tuple[Path, float]]:
    """Execute every notebook (or only ``notebooks``) into ``folder`` (figures and CSVs too), stamp each, and write
    the folder's README: one row per notebook with its wall time and date; the rows of notebooks not rerun stay."""
    import papermill

    # papermill reads a parameters cell line by line to list its parameters, and warns at every line of a value that
    # spans several (each lesson's SIZES): noise for this run, which passes SCALE and OUTPUT_DIR, both one line.
    logging.getLogger("papermill.translators").setLevel(logging.ERROR)
    folder, machine, today = Path(folder).resolve(), machine_line(), datetime.date.today().isoformat()
    readme = folder / "README.md"
    rows = _table_rows(readme) if notebooks else {}
    timings = []
    for source in notebooks or sources():
        target = copy_of(source, folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"== {source.relative_to(ROOT)}", flush=True)
        parameters, start = {**PARAMETERS, "OUTPUT_DIR": str(target.parent)}, time.perf_counter()
        # Copies made for reading run without the hub's bars and tqdm's default ones (the kernel inherits this
        # process's environment); ``stamp`` drops the bars the helpers draw (they pass ``disable`` themselves).
        with mock.patch.dict(os.environ, {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}):
            options = dict(parameters=parameters, cwd=str(target.parent), progress_bar=False, kernel_name="python3")
            papermill.execute_notebook(str(source), str(target), **options)
        seconds = time.perf_counter() - start
        stamp(target, machine, seconds, source)
        timings.append((target, seconds))
        link = target.relative_to(folder).as_posix()
        rows[link] = f"| [{link}]({link}) | {seconds:.0f} s | {today} |"
    table = "\n".join(row for _, row in sorted(rows.items()))
    readme.write_text(
        f"# Reference run\n\nThe course's notebooks executed once, with their outputs and figures, for reading without "
        f"running. **Machine:** {machine} (each notebook's first cell names the machine it ran on). Regenerate with "
        f"`make reference`, or one notebook with `python -m course.reference_run reference-run --only 01`; the tests "
        f"fail when a copy's code no longer matches its source notebook.\n\nEvery number here is that machine's. Each "
        f'notebook ran at its default scale (`SCALE="default"`, the sizes in its parameters cell) on the embedded '
        f"model, as it does on every machine: yours shows the same sizes at your machine's speed.\n\n"
        f"| notebook | wall time | executed |\n|---|---|---|\n{table}\n"
    )
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "reference-run"))
    only = "rerun only these lessons and their solutions (e.g. --only 01 03); other rows stay"
    parser.add_argument("--only", nargs="+", metavar="NN", default=None, help=only)
    args = parser.parse_args()
    numbers = {number.zfill(2) for number in args.only or []}
    chosen = [path for path in sources() if path.name[:2] in numbers]
    if missing := numbers - {path.name[:2] for path in chosen}:
        parser.error(f"no notebook numbered {', '.join(sorted(missing))}")
    run(Path(args.folder), chosen or None)


if __name__ == "__main__":
    main()
