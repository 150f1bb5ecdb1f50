"""The first code cell of every notebook: versions, device, threads (notebook 00 onwards)."""

from __future__ import annotations

import importlib.metadata
import platform

PACKAGES = ("torch", "transformers", "gguf", "accelerate", "pandas", "matplotlib", "papermill")


def versions(packages=PACKAGES) -> dict[str, str]:
    """Installed version of each package ("not installed" where missing)."""
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def describe_environment() -> str:
    """One line per fact: versions, then the device the series will use."""
    import torch

    from .models import cpu_threads, pick_device
    from .profile import machine_name

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
