"""Every notebook runs top to bottom on a clean kernel at small size, and is stored without outputs."""

import json
from pathlib import Path

import papermill
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Small sizes for the suite; each notebook receives only the parameters it declares.
SMALL = {
    "MODEL": "embedded",
    "N_TICKETS": 24,
    "N_GENERATE": 6,
    "N_PROBES": 6,
    "FULL_SCALE": False,
    "BATCH_SIZES": [4, 8],
    "SHOT_COUNTS": [0, 3],
    "REPEATS": 1,
}
# The benchmark runs every strategy in two dtypes: smaller still.
PER_NOTEBOOK = {"04_benchmarks": {"N_TICKETS": 8, "BATCH_SIZES": [4]}}


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_stored_without_outputs(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    dirty = [i for i, cell in enumerate(cells) if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))]
    assert not dirty, f"{notebook.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_at_small_size(notebook, tmp_path):
    declared = papermill.inspect_notebook(str(notebook))
    assert "MODEL" in declared and "N_TICKETS" in declared, f"{notebook.name}: parameters cell is missing knobs"
    small = {**SMALL, **PER_NOTEBOOK.get(notebook.stem, {})}
    parameters = {name: value for name, value in small.items() if name in declared}
    papermill.execute_notebook(
        str(notebook), str(tmp_path / notebook.name), parameters=parameters, cwd=str(tmp_path),
        progress_bar=False, kernel_name="python3",
    )
