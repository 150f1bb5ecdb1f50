"""The reference run's bookkeeping (course.reference_run): what each notebook runs with, and rerunning some notebooks
keeps the other rows of its README."""

import shutil
import sys
from pathlib import Path

import nbformat
import papermill
import pytest

from course import reference_run


@pytest.fixture()
def fake_papermill(monkeypatch):
    """Executing a notebook copies it: the bookkeeping is under test, not the notebooks."""
    ran = []

    def execute(source, target, parameters=None, **kwargs):
        ran.append((source, parameters))
        shutil.copy(source, target)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    monkeypatch.setattr(reference_run, "machine_line", lambda: "test machine")
    return ran


def test_rerunning_one_lesson_replaces_its_rows_and_keeps_the_others(tmp_path, fake_papermill):
    folder = tmp_path / "reference-run"
    folder.mkdir()
    (folder / "README.md").write_text(
        "# Reference run\n\n| notebook | wall time | executed |\n|---|---|---|\n"
        "| [00_setup.ipynb](00_setup.ipynb) | 20 s | 2026-11-30 |\n"
        "| [01_constrained_output.ipynb](01_constrained_output.ipynb) | 114 s | 2026-11-30 |\n"
    )
    chosen = [path for path in reference_run.sources() if path.name.startswith("01")]
    assert [path.parent.name for path in chosen] == ["notebooks", "solutions"], "the lesson and its solutions"
    reference_run.run(folder, chosen)
    assert [source for source, _ in fake_papermill] == [str(path) for path in chosen]
    for source, parameters in fake_papermill:  # the embedded model at the default scale, outputs beside the copy
        target = reference_run.copy_of(Path(source), folder)
        assert parameters == {"MODEL": "embedded", "SCALE": "default", "OUTPUT_DIR": str(target.parent)}, parameters
    rows = reference_run._table_rows(folder / "README.md")
    assert set(rows) == {"00_setup.ipynb", "01_constrained_output.ipynb", "solutions/01_solutions.ipynb"}
    assert rows["00_setup.ipynb"] == "| [00_setup.ipynb](00_setup.ipynb) | 20 s | 2026-11-30 |", "kept as it was"
    assert "114 s" not in rows["01_constrained_output.ipynb"] and rows["01_constrained_output.ipynb"].count("|") == 4
    readme = (folder / "README.md").read_text()
    assert "test machine" in readme and 'SCALE="default"' in readme and "preset" not in readme.lower(), readme
    copy = reference_run.nbformat.read(folder / "solutions" / "01_solutions.ipynb", as_version=4)
    assert copy.cells[0].source.startswith("> **Reference run, not your results:** test machine")


def test_only_refuses_a_number_no_notebook_has(monkeypatch, tmp_path, fake_papermill, capsys):
    monkeypatch.setattr(sys, "argv", ["executed", str(tmp_path), "--only", "1", "99"])
    with pytest.raises(SystemExit):
        reference_run.main()
    assert "no notebook numbered 99" in capsys.readouterr().err and not fake_papermill, "nothing runs on a bad number"


def test_a_stamped_copy_keeps_no_progress_bar_frozen_at_its_first_frame(tmp_path):
    """A tqdm bar saved as a widget shows 0 % to every reader: the copy drops it and keeps the cell's other outputs."""
    bar = nbformat.v4.new_output(
        "display_data", data={reference_run.WIDGET: {"model_id": "x"}, "text/plain": "2 rows x 2 rounds:   0%"}
    )
    printed = nbformat.v4.new_output("stream", name="stdout", text="loop at 1: 3.50 items/s")
    cell = nbformat.v4.new_code_cell("race()", outputs=[bar, printed])
    path = tmp_path / "03.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    reference_run.stamp(path, "test machine", 1.0, tmp_path / "source.ipynb")
    stamped = nbformat.read(path, as_version=4)
    assert stamped.cells[0].cell_type == "markdown" and "test machine" in stamped.cells[0].source
    assert [out.get("text") for out in stamped.cells[1].outputs] == ["loop at 1: 3.50 items/s"]
