"""Every notebook runs top to bottom at small size, each on a namespace of its own, and is stored without outputs."""

import json
import os
import re
from pathlib import Path

import papermill
import pytest

NOTEBOOK_DIR = Path(__file__).parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
# Worked solutions: solutions/NN_solutions.ipynb for lesson NN, one "## Exercise k" cell per exercise.
SOLUTIONS = sorted((NOTEBOOK_DIR / "solutions").glob("[0-9][0-9]_*.ipynb"))
# The suite runs every lesson and solutions notebook at its quick scale (each parameters cell holds its SIZES),
# with its figures and CSVs under a temporary folder. Lesson 00 loads the embedded model, as a reader's first run does;
# the others, and the solutions, run every cell and assertion on the random-weight tiny Qwen2, which has the embedded
# model's tokenizer and shows the errors the checks look for (test_models), in a fifth of the time. Their claims on the
# embedded model are the reference run's, executed at default scale and tied to this code by the currency test below.
SMALL = {"MODEL": "embedded", "SCALE": "quick"}
TWIN = "twin:tiny-qwen2"
REFERENCE_RUN = NOTEBOOK_DIR.parent / "reference-run"  # the committed executed copies (make reference)
SCALES = {"quick", "default", "full"}


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


@pytest.fixture(scope="session")
def kernel():
    """One Jupyter kernel per test worker for the quick runs. Importing torch and transformers is about 10 s of each
    quick run's 20-30 s on 2 cores; a kept kernel pays it once. Before each notebook its namespace is cleared
    (``%reset -f``: a name a notebook uses but does not define fails as on a fresh kernel) and it moves to the
    notebook's folder. Imported modules stay loaded, so the reference run (``make reference``) and ``make notebooks``
    are what run each notebook on a fresh kernel."""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(env={**os.environ, "SLM_DEVICE": "cpu"})  # the tests' device (conftest), set before any test
    yield manager
    manager.shutdown_kernel(now=True)


def reset(manager, folder: Path) -> None:
    """A kept kernel made ready for the next notebook: restarted if a crash killed it, namespace and figures cleared,
    working folder moved."""
    if not manager.is_alive():
        manager.restart_kernel(now=True)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        move = f"import matplotlib.pyplot, os\nmatplotlib.pyplot.close('all')\nos.chdir({str(folder)!r})"
        code = f"%reset -f\n{move}\n%reset -f"
        reply = client.execute_interactive(code, timeout=60, output_hook=lambda message: None)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()


def run_small(notebook: Path, declared, tmp_path: Path, extra: dict | None = None, kernel=None):
    """Execute a notebook at its quick scale, its outputs under tmp_path/out; nothing may land in notebooks/.
    ``kernel``: a kept kernel (the fixture above), reset first; without one, a fresh kernel."""
    small = {**SMALL, **(extra or {}), "OUTPUT_DIR": str(tmp_path / "out")}
    parameters = {name: value for name, value in small.items() if name in declared}
    before = sorted(NOTEBOOK_DIR.rglob("*"))
    if kernel is not None:
        reset(kernel, tmp_path)
    executed = papermill.execute_notebook(
        str(notebook),
        str(tmp_path / notebook.name),
        parameters=parameters,
        cwd=str(tmp_path),
        progress_bar=False,
        kernel_name="python3",
        km=kernel,
    )
    assert sorted(NOTEBOOK_DIR.rglob("*")) == before, f"{notebook.name} wrote into notebooks/"
    return executed


def printed_lines(executed) -> list[str]:
    return "".join(
        "".join(output.get("text", "")) for cell in executed["cells"] for output in cell.get("outputs", [])
    ).splitlines()


def markdown(notebook: Path) -> list[str]:
    return [
        "".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == "markdown"
    ]


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
    assert not any(cell.startswith(f"## Exercise {len(wanted) + 1}") for cell in cells), (
        f"{solutions.name}: extra exercises"
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_lesson_has_a_summary_and_going_deeper_after_it(notebook):
    cells = markdown(notebook)
    summary = [i for i, cell in enumerate(cells) if cell.startswith("## Summary")]
    assert summary, f"{notebook.name}: no '## Summary' heading"
    deeper = [i for i, cell in enumerate(cells) if cell.startswith("## Going deeper")]
    assert all(i > summary[0] for i in deeper), f"{notebook.name}: 'Going deeper' before the summary"


def test_every_lesson_of_the_reference_run_reads_in_a_workshop_slot_with_its_idea_in_code():
    """By the reading rule (course.reading): each core path at most 17 minutes, 00-04 together at most 75; 01-03
    keep at least 30 visible code lines in their core (the idea stays in code, the harness collapses)."""
    from course.reading import LIMIT, lessons

    read = lessons(REFERENCE_RUN)
    assert set(read) == {notebook.stem[:2] for notebook in NOTEBOOKS}, sorted(read)
    slow = {number: counts for number, counts in read.items() if counts["minutes"] > LIMIT}
    assert not slow, f"core paths over {LIMIT} minutes by the rule: {slow}"
    core = sum(read[number]["minutes"] for number in ("00", "01", "02", "03", "04"))
    assert core <= 75, f"00-04 read in {core:.1f} minutes by the rule, over 75"
    thin = {number: read[number]["code"] for number in ("01", "02", "03") if read[number]["code"] < 30}
    assert not thin, f"lessons whose core shows fewer than 30 lines of code: {thin}"


def your_turns(lesson: Path) -> list[str]:
    """The lesson's inline "**Your turn k.**" prompts, in order, whitespace collapsed."""
    cells = [cell for cell in markdown(lesson) if cell.startswith("**Your turn ")]
    return [" ".join(re.sub(r"^\*\*Your turn \d+\.\*\*", "", cell).split()) for cell in cells]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_lesson_asks_the_reader_to_act_inline_and_answers_it(notebook):
    """At least two "your turn" cells in the lesson, numbered in order, each followed by the code cell it asks to
    change, and each answered under "## Your turn k" in the solutions (which the suite executes)."""
    cells = json.loads(notebook.read_text())["cells"]
    prompts = [
        i
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "markdown" and "".join(cell["source"]).startswith("**Your turn ")
    ]
    assert len(prompts) >= 2, f"{notebook.name}: {len(prompts)} 'your turn' cell(s), want at least 2"
    numbers = [int(re.match(r"\*\*Your turn (\d+)\.", "".join(cells[i]["source"])).group(1)) for i in prompts]
    assert numbers == list(range(1, len(prompts) + 1)), f"{notebook.name}: your turns numbered {numbers}"
    assert all(cells[i + 1]["cell_type"] == "code" for i in prompts), (
        f"{notebook.name}: a your-turn without its code cell"
    )
    solutions = NOTEBOOK_DIR / "solutions" / f"{notebook.stem[:2]}_solutions.ipynb"
    answers = [" ".join(cell.split()) for cell in markdown(solutions)]
    for k, prompt in enumerate(your_turns(notebook), start=1):
        heading = [cell for cell in answers if cell.startswith(f"## Your turn {k} ")]
        assert heading, f"{solutions.name}: no '## Your turn {k}' cell"
        assert prompt in heading[0], f"{solutions.name}: your turn {k} does not quote the lesson: {prompt!r}"


@pytest.mark.parametrize("notebook", NOTEBOOKS + SOLUTIONS, ids=lambda path: path.stem)
def test_notebook_is_stored_without_outputs(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    dirty = [
        i
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))
    ]
    assert not dirty, f"{notebook.name}: cells {dirty} have outputs; clear them before committing"


def code_before_first_section(notebook: Path) -> list[str]:
    """The code lines (not blank, not comments) before a lesson's "## 1." heading, the setup cell aside (it does
    nothing where the course is installed): the parameters, then the few plain lines that load the model."""
    lines = []
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and re.search(r"^## 1\.", source, re.M):
            return lines
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and "setup" not in tags:
            lines += [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    raise AssertionError(f"{notebook.name} has no '## 1.' heading")


@pytest.mark.parametrize(
    "notebook", [nb for nb in NOTEBOOKS if not nb.stem.startswith("00")], ids=lambda path: path.stem
)
def test_a_lesson_reaches_its_first_idea_within_a_screen_of_code(notebook):
    """At most 18 lines of code before the first section (comments aside): the parameters' table, one line or two per
    scale as its sizes need (the guide: never pack statements to fit a count), and loading the model."""
    lines = code_before_first_section(notebook)
    assert len(lines) <= 18, f"{notebook.name}: {len(lines)} lines of code before its first section:\n" + "\n".join(
        lines
    )


def sizes_of(notebook: Path) -> dict:
    """The SIZES table of a notebook's parameters cell, evaluated."""
    cell = next(
        cell
        for cell in json.loads(notebook.read_text())["cells"]
        if "parameters" in cell.get("metadata", {}).get("tags", [])
    )
    names: dict = {}
    exec("".join(cell["source"]), {}, names)
    return names.get("SIZES", {})


@pytest.mark.parametrize(
    "notebook", [nb for nb in NOTEBOOKS + SOLUTIONS if not nb.stem.startswith("00")], ids=lambda path: path.stem
)
def test_every_size_a_lesson_runs_is_in_its_parameters_cell_at_each_scale(notebook):
    declared = papermill.inspect_notebook(str(notebook))
    for name in ("MODEL", "SCALE", "OUTPUT_DIR"):
        assert name in declared, f"{notebook.name}: no {name} in its parameters cell"
    sizes = sizes_of(notebook)  # evaluated: papermill's own reader skips a dict of dict(...) calls
    assert set(sizes) == SCALES, f"{notebook.name}: SIZES has scales {sorted(sizes)}, want {sorted(SCALES)}"
    # The same sizes in the same order at every scale: the opening cell unpacks them with SIZES[SCALE].values().
    keys = {scale: list(values) for scale, values in sizes.items()}
    assert len({tuple(k) for k in keys.values()}) == 1, f"{notebook.name}: the scales list different sizes: {keys}"
    source = "".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"])
    for gone in ("TIME_BUDGET_S", "OPTIONS", "open_lesson", "PRESET", "helpers.costs", "helpers.sizing"):
        assert gone not in source, f"{notebook.name} still uses {gone}"


# 00 13, 01 23 (its label prior), 02 21, 03 21, 04 24 (its Going deeper's engine race), 05 22 names today; the aim is
# about 20
HELPERS_NAMES = 24


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_a_lesson_imports_few_names_from_helpers(notebook):
    source = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"])
    names = set()
    for match in re.finditer(r"^from helpers(?:\.\w+)? import (\([^)]*\)|[^\n]+)", source, re.M):
        listed = match.group(1).strip("()").split("#")[0]
        names |= {part.split(" as ")[0].strip() for part in listed.replace("\n", ",").split(",") if part.strip()}
    names |= set(re.findall(r"^import (helpers\.\w+)", source, re.M))
    assert len(names) <= HELPERS_NAMES, f"{notebook.name} imports {len(names)} names from helpers: {sorted(names)}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_at_small_size(notebook, tmp_path, kernel):
    """Every lesson runs at its quick scale, and every figure it says it saved is there."""
    declared = papermill.inspect_notebook(str(notebook))
    missing = {"MODEL", "OUTPUT_DIR", "SCALE"} - declared.keys()  # make notebooks passes SCALE
    assert not missing, f"{notebook.name}: parameters cell is missing {sorted(missing)}"
    executed = run_small(
        notebook, declared, tmp_path, extra=None if notebook.name.startswith("00") else {"MODEL": TWIN}, kernel=kernel
    )
    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    # the figures and tables it says it saved (the machine profile's cache, when 00 measures it, is not an output)
    saved = [line for line in printed_lines(executed) if "saved" in line and str(tmp_path / "out") in line]
    unnamed = [name for name in written if not any(name in line for line in saved)]
    assert not unnamed, f"{notebook.name} wrote {unnamed} but no 'saved' line names them"
    named = {name for line in saved for name in re.findall(r"[\w.-]+\.(?:png|csv)", line)}
    assert named <= set(written), f"{notebook.name} says it saved {sorted(named - set(written))}: not there"


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda path: path.stem)
def test_solutions_run_at_small_size(notebook, tmp_path, kernel):
    declared = papermill.inspect_notebook(str(notebook))
    missing = {"MODEL", "OUTPUT_DIR", "SCALE"} - declared.keys()  # make notebooks passes SCALE
    assert not missing, f"{notebook.name}: parameters cell is missing {sorted(missing)}"
    run_small(notebook, declared, tmp_path, extra={"MODEL": TWIN}, kernel=kernel)


@pytest.mark.parametrize("notebook", NOTEBOOKS + SOLUTIONS, ids=lambda path: path.stem)
def test_the_reference_run_shows_the_current_code(notebook):
    """The committed executed copies (make reference) cannot drift: same code cells as the source, parameters aside."""
    from course.reference_run import code_cells, copy_of

    copy = copy_of(notebook, REFERENCE_RUN)
    assert copy.exists(), f"{copy.relative_to(NOTEBOOK_DIR.parent)} is missing: run `make reference`"
    assert code_cells(copy) == code_cells(notebook), (
        f"{copy.relative_to(NOTEBOOK_DIR.parent)} runs other code than {notebook.name}: run `make reference`"
    )
    first = json.loads(copy.read_text())["cells"][0]
    assert first["cell_type"] == "markdown" and "Reference run, not your results:" in "".join(first["source"]), (
        "no machine named at the top"
    )


def test_the_reference_run_is_one_run_lessons_and_solutions_on_one_machine_within_a_day():
    """Lessons and solutions are read side by side: their numbers compare only when one machine ran them all, within
    a day (a solution that says the lesson scored 90 tickets, or ran 3x faster, came from another run)."""
    import datetime

    from course.reference_run import copy_of

    stamps = {}
    for notebook in NOTEBOOKS + SOLUTIONS:
        first = "".join(json.loads(copy_of(notebook, REFERENCE_RUN).read_text())["cells"][0]["source"])
        found = re.search(r"not your results:\*\* (.+), (\d{4}-\d{2}-\d{2}), \d+ s", first)
        assert found, f"{notebook.name}: its reference copy names no machine and day at the top"
        stamps[notebook.name] = found.group(1), datetime.date.fromisoformat(found.group(2))
    machines = {machine for machine, _ in stamps.values()}
    assert len(machines) == 1, f"the reference run names {len(machines)} machines: run `make reference` once"
    days = sorted(day for _, day in stamps.values())
    assert (days[-1] - days[0]).days <= 1, f"the reference run spans {days[0]} to {days[-1]}: run `make reference`"


PRINTED_WORDS = 900  # what a lesson of the reference run may print, progress bars aside


def printed_words(cell: dict) -> int:
    """Words a code cell shows a reader: its stdout and its tables (HTML tags aside), not figures or progress bars."""
    words = 0
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream" and output.get("name") == "stdout":
            lines = "".join(output["text"]).splitlines()
            words += sum(len(line.split()) for line in lines if not re.search(r"\d+%\|", line))  # a bar's frame
        data = output.get("data", {})
        if "text/html" in data:
            words += len(re.sub(r"<[^>]+>", " ", "".join(data["text/html"])).split())
        elif "text/plain" in data and "image/png" not in data:
            words += len("".join(data["text/plain"]).split())
    return words


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_lesson_of_the_reference_run_prints_more_than_a_reader_can_follow(notebook):
    from course.reference_run import copy_of

    cells = json.loads(copy_of(notebook, REFERENCE_RUN).read_text())["cells"]
    counts = {i: printed_words(cell) for i, cell in enumerate(cells) if cell["cell_type"] == "code"}
    loudest = sorted(counts.items(), key=lambda item: -item[1])[:3]
    assert sum(counts.values()) <= PRINTED_WORDS, (
        f"{notebook.name}: the reference run prints {sum(counts.values())} words, over {PRINTED_WORDS}; "
        f"loudest cells (index, words): {loudest}"
    )


def test_teaching_md_plans_each_lesson_at_its_stated_pace_and_fits_three_hours():
    """TEACHING.md's plan is the rule's: its reading column is course.reading on the reference run, rounded to a
    minute. A lesson run hands-on takes at least its reading at the pace the page states (a pace no faster than the
    latest attendee read it cites), plus its cells' run time (the reference run's wall time, rounded up to a minute)
    and 2 minutes a Your turn; a lesson walked on the projector from the reference run takes at least its reading at
    the rule's own pace (the instructor reads it aloud), nothing run. 00-04, the break, the exercises and the wrap-up
    fit 180 minutes."""
    import math

    from course.reading import lessons

    teaching = (NOTEBOOK_DIR.parent / "TEACHING.md").read_text()
    pace = re.search(r"plans for (\d+(?:\.\d+)?)x the rule", teaching)
    assert pace, "TEACHING.md states no reading pace ('plans for N.Nx the rule')"
    latest = re.search(r"the latest attendee read measured (\d+(?:\.\d+)?)x", teaching)
    faster = not latest or float(pace.group(1)) < float(latest.group(1))
    assert not faster, "TEACHING.md cites no latest attendee read, or plans for faster reading than it measured"
    walls = dict(re.findall(r"^\| \[(\d\d)_[^|]*\| (\d+) s \|", (REFERENCE_RUN / "README.md").read_text(), re.M))
    room, ways = 0, set()
    for number, counts in lessons(REFERENCE_RUN).items():
        row = re.search(rf"^\| {number} [^|]*\| (hands-on|projector) \| ~(\d+) min \| (\d+) min \| (\d+) min \| (\d+) "
                        r"min \|", teaching, re.M)  # fmt: skip
        assert row, f"TEACHING.md has no plan row for lesson {number} (how, reading, running, your turns, in the room)"
        how, (said, running, turns, minutes) = row.group(1), map(int, row.groups()[1:])
        assert said == max(1, round(counts["minutes"])), f"{number}: TEACHING.md says ~{said} min, the rule {counts}"
        if how == "hands-on":
            assert running >= math.ceil(int(walls[number]) / 60), f"{number}: its cells run {walls[number]} s"
            cells = markdown(next(NOTEBOOK_DIR.glob(f"{number}_*.ipynb")))
            core = cells[: next(i for i, cell in enumerate(cells) if cell.startswith("## Summary"))]
            assert turns >= 2 * sum(cell.startswith("**Your turn ") for cell in core), f"{number}: 2 min a Your turn"
        least = math.ceil((float(pace.group(1)) if how == "hands-on" else 1.0) * counts["minutes"] + running + turns)
        assert minutes >= least, f"{number}: {minutes} min in the room, under {least} {how}"
        room, ways = room + (minutes if number <= "04" else 0), ways | ({how} if number <= "04" else set())
    assert ways == {"hands-on", "projector"} or ways == {"hands-on"}, ways
    others = re.findall(r"^\| (break|exercises|wrap-up) \|[^|]*\|[^|]*\|[^|]*\|[^|]*\| (\d+) min \|", teaching, re.M)
    assert len(others) == 3, others
    assert room + sum(int(minutes) for _, minutes in others) <= 180, (room, others)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_name_a_visible_cell_uses_is_defined_in_sight(notebook):
    """A reader edits the visible cells: each name they use is defined or imported in a visible cell before it (core
    path and Going deeper), never only in a collapsed one (read by syntax tree, course.reading.out_of_sight)."""
    from course.reading import out_of_sight

    leaks = out_of_sight(notebook)
    assert not leaks, f"{notebook.name}: visible cells use names defined only in collapsed cells (cell: names): {leaks}"


def test_lesson_05_shows_what_rounding_flips_where_no_half_dtype_runs_fast(tmp_path, kernel):
    """Which labels rounding flips is numerics, not speed: where no half dtype is chosen (DTYPES float32 alone, as the
    profile leaves it on a CPU without fast bfloat16), 05 still rounds a handful of tickets, draws its margins
    figure, verifies, and skips only the race, saying why and what it would cost."""
    notebook = NOTEBOOK_DIR / "05_precision.ipynb"
    declared = papermill.inspect_notebook(str(notebook))
    executed = run_small(notebook, declared, tmp_path, extra={"MODEL": TWIN, "DTYPES": ["float32"]}, kernel=kernel)
    printed = "\n".join(printed_lines(executed))
    assert "none runs fast here, so sections 2-3 round" in printed, printed[:2000]
    assert "no race:" in printed and "would take about" in printed, printed[-2000:]
    assert "verified: margin error" in printed and (tmp_path / "out" / "precision_margins.png").is_file()
