"""Every notebook runs top to bottom on a clean kernel at small size, and is stored without outputs."""

import json
from pathlib import Path

import papermill
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Small sizes for the suite: a tiny time budget, so each notebook sizes itself to its floors (the sizing code runs
# as it does for a reader). Each notebook receives only the parameters it declares.
SMALL = {
    "MODEL": "embedded",
    "TIME_BUDGET_S": 5,
    "FULL_SCALE": False,
    "SHOT_COUNTS": [0, 3],
    "REPEATS": 1,
}
# bfloat16 code paths are covered by the benchmark tests on a tiny model; the notebook runs float32 only.
PER_NOTEBOOK = {"04_benchmarks": {"DTYPES": ["float32"]}}


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


def printed_lines(executed) -> list[str]:
    return "".join("".join(output.get("text", "")) for cell in executed["cells"] for output in cell.get("outputs", [])).splitlines()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_stored_without_outputs(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    dirty = [i for i, cell in enumerate(cells) if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))]
    assert not dirty, f"{notebook.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_at_small_size(notebook, tmp_path):
    declared = papermill.inspect_notebook(str(notebook))
    assert "MODEL" in declared and "N_TICKETS" in declared, f"{notebook.name}: parameters cell is missing knobs"
    sized = not notebook.stem.startswith("00")
    if sized:
        assert "TIME_BUDGET_S" in declared, f"{notebook.name}: no time budget parameter"
    small = {**SMALL, **PER_NOTEBOOK.get(notebook.stem, {})}
    parameters = {name: value for name, value in small.items() if name in declared}
    assert "OUTPUT_DIR" in declared, f"{notebook.name}: no OUTPUT_DIR parameter for its figures and CSVs"
    parameters["OUTPUT_DIR"] = str(tmp_path / "out")
    before = sorted(notebook.parent.rglob("*"))
    executed = papermill.execute_notebook(
        str(notebook), str(tmp_path / notebook.name), parameters=parameters, cwd=str(tmp_path),
        progress_bar=False, kernel_name="python3",
    )
    assert sorted(notebook.parent.rglob("*")) == before, f"{notebook.name} wrote into notebooks/"
    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    saved = [line for line in printed_lines(executed) if "saved" in line]
    assert all(any(name in line for name in written) for line in saved), (saved, written)
    printed = "".join("".join(output.get("text", "")) for cell in executed["cells"] for output in cell.get("outputs", []))
    if sized:
        assert "tickets: the fewest that keep the lesson visible" in printed or "within the 5 s budget" in printed, \
            f"{notebook.name}: the notebook must say how many tickets it chose and why"
