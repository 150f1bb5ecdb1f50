"""The reference run's bookkeeping (helpers.executed): rerunning some notebooks keeps the other rows of its README."""

import shutil
import sys

import papermill
import pytest

from helpers import executed


@pytest.fixture()
def fake_papermill(monkeypatch):
    """Executing a notebook copies it: the bookkeeping is under test, not the notebooks."""
    ran = []

    def execute(source, target, **kwargs):
        ran.append(source)
        shutil.copy(source, target)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    monkeypatch.setattr(executed, "machine_line", lambda: "test machine")
    return ran


def test_rerunning_one_lesson_replaces_its_rows_and_keeps_the_others(tmp_path, fake_papermill):
    folder = tmp_path / "reference-run"
    folder.mkdir()
    # A README as written before rows carried dates: one date for the whole run.
    (folder / "README.md").write_text("# Reference run\n\n**Machine:** old. **Date:** 2026-11-30. Regenerate.\n\n"
                                      "| notebook | wall time |\n|---|---|\n"
                                      "| [00_setup.ipynb](00_setup.ipynb) | 20 s |\n"
                                      "| [01_constrained_output.ipynb](01_constrained_output.ipynb) | 114 s |\n")
    chosen = [path for path in executed.sources() if path.name.startswith("01")]
    assert [path.parent.name for path in chosen] == ["notebooks", "solutions"], "the lesson and its solutions"
    executed.run(folder, chosen)
    assert [str(path) for path in chosen] == fake_papermill
    rows = executed._table_rows(folder / "README.md")
    assert set(rows) == {"00_setup.ipynb", "01_constrained_output.ipynb", "solutions/01_solutions.ipynb"}
    assert rows["00_setup.ipynb"] == "| [00_setup.ipynb](00_setup.ipynb) | 20 s | 2026-11-30 |", "kept, with the old date"
    assert "114 s" not in rows["01_constrained_output.ipynb"] and rows["01_constrained_output.ipynb"].count("|") == 4
    assert (folder / "solutions" / "01_solutions.ipynb").exists()


def test_only_refuses_a_number_no_notebook_has(monkeypatch, tmp_path, fake_papermill, capsys):
    monkeypatch.setattr(sys, "argv", ["executed", str(tmp_path), "--only", "1", "99"])
    with pytest.raises(SystemExit):
        executed.main()
    assert "no notebook numbered 99" in capsys.readouterr().err and not fake_papermill, "nothing runs on a bad number"
