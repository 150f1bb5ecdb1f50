"""Every notebook runs top to bottom on a clean kernel at small size, and is stored without outputs."""

import json
import re
from pathlib import Path

import papermill
import pytest

NOTEBOOK_DIR = Path(__file__).parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
# Worked solutions: solutions/NN_solutions.ipynb for lesson NN, one "## Exercise k" cell per exercise.
SOLUTIONS = sorted((NOTEBOOK_DIR / "solutions").glob("[0-9][0-9]_*.ipynb"))
# Small sizes for the suite. A lesson runs its recorded "test" configuration (helpers.costs.CONFIGS: every count
# named, so its forward calls are the same on every machine and checked against the cost record); the solutions
# run their own small sizes. Each notebook takes the parameters it declares, a lesson the rest in OPTIONS.
SOLUTIONS_SMALL = {
    "MODEL": "embedded",
    "TIME_BUDGET_S": 5,
    "FULL_SCALE": False,
    "SHOT_COUNTS": [0, 3],
    "FEW_SHOT": 3,
    "REPEATS": 1,
}
PER_SOLUTION = {
    "01_solutions": {"N_TICKETS": 12},
    "03_solutions": {"N_TICKETS": 6},
    "04_solutions": {"N_TICKETS": 4, "SHOTS": 1, "TWINS": ["embedded"], "N_FORCED": 2},  # exercise 2: another model than MODEL
}


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


def lesson_of(notebook: Path) -> str | None:
    """"01" for a lesson opened with ``open_lesson`` and recorded in the cost record; None for 00 and solutions."""
    from helpers.costs import CONFIGS

    return notebook.stem[:2] if notebook.parent == NOTEBOOK_DIR and notebook.stem[:2] in CONFIGS else None


def run_small(notebook: Path, declared, tmp_path: Path, extra: dict | None = None):
    """Execute a notebook at small size (a lesson: its recorded test run; else the solutions' sizes it declares, and
    ``extra``), its outputs under tmp_path/out; nothing may land in notebooks/ (lessons and solutions alike)."""
    from helpers.costs import settings_for
    from helpers.lessons import papermill_parameters

    lesson = lesson_of(notebook)
    if lesson is not None:
        small = {**settings_for(lesson, "test"), "OUTPUT_DIR": str(tmp_path / "out"), **(extra or {})}
        parameters = papermill_parameters(declared, small)
    else:
        small = {**SOLUTIONS_SMALL, **PER_SOLUTION.get(notebook.stem, {}), **(extra or {})}
        parameters = {name: value for name, value in small.items() if name in declared}
        parameters["OUTPUT_DIR"] = str(tmp_path / "out")
    before = sorted(NOTEBOOK_DIR.rglob("*"))
    executed = papermill.execute_notebook(str(notebook), str(tmp_path / notebook.name), parameters=parameters,
                                          cwd=str(tmp_path), progress_bar=False, kernel_name="python3")
    assert sorted(NOTEBOOK_DIR.rglob("*")) == before, f"{notebook.name} wrote into notebooks/"
    return executed


def printed_lines(executed) -> list[str]:
    return "".join("".join(output.get("text", "")) for cell in executed["cells"] for output in cell.get("outputs", [])).splitlines()


def markdown(notebook: Path) -> list[str]:
    return ["".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == "markdown"]


def exercises(lesson: Path) -> list[str]:
    """The numbered items under the lesson's "### Exercises" heading, whitespace collapsed."""
    text = "\n".join(markdown(lesson))
    if "### Exercises" not in text:
        return []
    body = re.split(r"^## ", text.split("### Exercises", 1)[1], flags=re.M)[0]  # up to "## Going deeper", if any
    items = re.split(r"^\d+\. ", body, flags=re.M)[1:]
    return [" ".join(item.split()) for item in items]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_exercise_has_a_worked_solution(notebook):
    wanted = exercises(notebook)
    if not wanted:
        pytest.skip(f"{notebook.name} has no exercises")
    solutions = NOTEBOOK_DIR / "solutions" / f"{notebook.stem[:2]}_solutions.ipynb"
    assert solutions.exists(), f"{notebook.name}: no {solutions.relative_to(NOTEBOOK_DIR.parent)}"
    cells = [" ".join(cell.split()) for cell in markdown(solutions)]
    for k, exercise in enumerate(wanted, start=1):
        heading = [cell for cell in cells if cell.startswith(f"## Exercise {k}")]
        assert heading, f"{solutions.name}: no '## Exercise {k}' cell"
        assert exercise in heading[0], f"{solutions.name}: exercise {k} does not quote the lesson's text: {exercise!r}"
    assert not any(cell.startswith(f"## Exercise {len(wanted) + 1}") for cell in cells), f"{solutions.name}: extra exercises"


CORE_PATH_WORDS = 1500  # about 15 minutes of reading at 100-150 words a minute, code beside it


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_lesson_core_path_reads_in_about_15_minutes(notebook):
    """The markdown up to the summary; exercises and *Going deeper* come after it."""
    cells = markdown(notebook)
    summary = [i for i, cell in enumerate(cells) if cell.startswith("## Summary")]
    assert summary, f"{notebook.name}: no '## Summary' heading"
    words = sum(len(cell.split()) for cell in cells[:summary[0]])
    assert words <= CORE_PATH_WORDS, f"{notebook.name}: {words} words before its summary, over {CORE_PATH_WORDS}"
    deeper = [i for i, cell in enumerate(cells) if cell.startswith("## Going deeper")]
    assert all(i > summary[0] for i in deeper), f"{notebook.name}: 'Going deeper' before the summary"


def your_turns(lesson: Path) -> list[str]:
    """The lesson's inline "**Your turn k.**" prompts, in order, whitespace collapsed."""
    cells = [cell for cell in markdown(lesson) if cell.startswith("**Your turn ")]
    return [" ".join(re.sub(r"^\*\*Your turn \d+\.\*\*", "", cell).split()) for cell in cells]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_lesson_asks_the_reader_to_act_inline_and_answers_it(notebook):
    """At least two "your turn" cells in the lesson, numbered in order, each followed by the code cell it asks to
    change, and each answered under "## Your turn k" in the solutions (which the suite executes)."""
    cells = json.loads(notebook.read_text())["cells"]
    prompts = [i for i, cell in enumerate(cells) if cell["cell_type"] == "markdown"
               and "".join(cell["source"]).startswith("**Your turn ")]
    assert len(prompts) >= 2, f"{notebook.name}: {len(prompts)} 'your turn' cell(s), want at least 2"
    numbers = [int(re.match(r"\*\*Your turn (\d+)\.", "".join(cells[i]["source"])).group(1)) for i in prompts]
    assert numbers == list(range(1, len(prompts) + 1)), f"{notebook.name}: your turns numbered {numbers}"
    assert all(cells[i + 1]["cell_type"] == "code" for i in prompts), f"{notebook.name}: a your-turn without its code cell"
    solutions = NOTEBOOK_DIR / "solutions" / f"{notebook.stem[:2]}_solutions.ipynb"
    answers = [" ".join(cell.split()) for cell in markdown(solutions)]
    for k, prompt in enumerate(your_turns(notebook), start=1):
        heading = [cell for cell in answers if cell.startswith(f"## Your turn {k} ")]
        assert heading, f"{solutions.name}: no '## Your turn {k}' cell"
        assert prompt in heading[0], f"{solutions.name}: your turn {k} does not quote the lesson: {prompt!r}"


@pytest.mark.parametrize("notebook", NOTEBOOKS + SOLUTIONS, ids=lambda path: path.stem)
def test_notebook_is_stored_without_outputs(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    dirty = [i for i, cell in enumerate(cells) if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))]
    assert not dirty, f"{notebook.name}: cells {dirty} have outputs; clear them before committing"


def code_before_first_section(notebook: Path) -> list[str]:
    """The non-blank code lines before a lesson's "## 1." heading, the setup cell aside."""
    lines = []
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and re.search(r"^## 1\.", source, re.M):
            return lines
        if cell["cell_type"] == "code" and "setup" not in cell.get("metadata", {}).get("tags", []):
            lines += [line for line in source.splitlines() if line.strip()]
    raise AssertionError(f"{notebook.name} has no '## 1.' heading")


@pytest.mark.parametrize("notebook", [nb for nb in NOTEBOOKS if not nb.stem.startswith("00")], ids=lambda path: path.stem)
def test_a_lesson_reaches_its_first_idea_after_at_most_15_lines_of_code(notebook):
    lines = code_before_first_section(notebook)
    assert len(lines) <= 15, f"{notebook.name}: {len(lines)} lines of code before its first section:\n" + "\n".join(lines)
    knobs = [name for name in papermill.inspect_notebook(str(notebook)) if name != "OPTIONS"]
    assert 3 <= len(knobs) <= 5, f"{notebook.name}: {len(knobs)} parameters in sight ({knobs}); rarely used ones go in OPTIONS"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_at_small_size(notebook, tmp_path, monkeypatch):
    """Every lesson runs at small size, says how many tickets it chose and why, and makes the forward calls its cost
    record (helpers.costs) holds for that run: a pass added, removed or reshaped fails here until the record is
    regenerated."""
    from helpers import calls, costs

    declared = papermill.inspect_notebook(str(notebook))
    lesson = lesson_of(notebook)
    assert "MODEL" in declared and ("N_TICKETS" in declared or "TICKETS_PER_POINT" in declared), \
        f"{notebook.name}: parameters cell is missing knobs"
    if lesson is not None:
        assert "TIME_BUDGET_S" in declared and "OPTIONS" in declared, f"{notebook.name}: no time budget or OPTIONS"
        monkeypatch.setenv(calls.ENV, str(tmp_path / "calls.jsonl"))
    else:
        assert "OUTPUT_DIR" in declared, f"{notebook.name}: no OUTPUT_DIR parameter for its figures and CSVs"
    executed = run_small(notebook, declared, tmp_path)
    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    saved = [line for line in printed_lines(executed) if "saved" in line]
    assert all(any(name in line for name in written) for line in saved), (saved, written)
    if lesson is None:
        return
    printed = "".join("".join(output.get("text", "")) for cell in executed["cells"] for output in cell.get("outputs", []))
    assert any(why in printed for why in ("tickets: set explicitly (estimated", "each point at least")), \
        f"{notebook.name}: the notebook must say how many tickets it chose and why"
    recorded = calls.read(tmp_path / "calls.jsonl") if (tmp_path / "calls.jsonl").exists() else {}
    changed = costs.differences(lesson, costs.cells_of(executed, recorded))
    assert not changed, (f"{notebook.name} makes other forward calls than its cost record holds; regenerate the cost "
                         f"record (python -m helpers costs --only {lesson}):\n" + "\n".join(changed))


# The solutions run on the random-weight tiny Qwen2 (every cell and assertion, in seconds); their answers on the
# embedded model are in the reference run, and the lessons, whose claims readers check, run on the embedded model.
SOLUTIONS_MODEL = "twin:tiny-qwen2"


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda path: path.stem)
def test_solutions_run_at_small_size(notebook, tmp_path):
    declared = papermill.inspect_notebook(str(notebook))
    assert "MODEL" in declared and "OUTPUT_DIR" in declared, f"{notebook.name}: parameters cell is missing knobs"
    run_small(notebook, declared, tmp_path, extra={"MODEL": SOLUTIONS_MODEL})


REFERENCE_RUN = NOTEBOOK_DIR.parent / "reference-run"


@pytest.mark.parametrize("notebook", NOTEBOOKS + SOLUTIONS, ids=lambda path: path.stem)
def test_the_reference_run_shows_the_current_code(notebook):
    """The committed executed copies (make reference) cannot drift: same code cells as the source, parameters aside."""
    from helpers.executed import code_cells, copy_of

    copy = copy_of(notebook, REFERENCE_RUN)
    assert copy.exists(), f"{copy.relative_to(NOTEBOOK_DIR.parent)} is missing: run `make reference`"
    assert code_cells(copy) == code_cells(notebook), \
        f"{copy.relative_to(NOTEBOOK_DIR.parent)} runs other code than {notebook.name}: run `make reference`"
    first = json.loads(copy.read_text())["cells"][0]
    assert first["cell_type"] == "markdown" and "Executed on" in "".join(first["source"]), "no machine named at the top"
