"""Where a model runs and in which precision: the device (CUDA, Apple's MPS, else the CPU), the dtype (float32 unless
asked; a half dtype is probed for finite logits first), and what to do when a device runs out of memory.
"""

from __future__ import annotations

import os

import torch


DEVICES = ("auto", "cpu", "cuda", "mps")


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The device asked for, else ``$SLM_DEVICE``, else CUDA, then Apple's MPS, then the CPU ("auto"). An unavailable
    one is a one-line error."""
    if device is None:
        device = os.environ.get("SLM_DEVICE") or None
    if device is not None and str(device) != "auto":
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA GPU here (a CPU-only torch build, "
                               "or no driver): use --device auto or cpu")
        if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise RuntimeError("device 'mps' asked for, but Apple's MPS is not available here: use --device auto or cpu")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def cuda_bfloat16(device: torch.device, capability: tuple[int, int] | None = None) -> bool:
    """Whether a CUDA GPU runs bfloat16 natively: from compute capability 8.0 (Ampere) on. A T4 (7.5) only
    emulates it, although ``torch.cuda.is_bf16_supported()`` says True there."""
    return tuple(capability or torch.cuda.get_device_capability(device)) >= (8, 0)


def dtype_candidates(device: torch.device | str, capability: tuple[int, int] | None = None) -> list[torch.dtype]:
    """The dtypes worth measuring (and running, where measured fast) on a device, float32 first.

    CPU: bfloat16 (native on some CPUs, emulated and slow on others: the profile decides). CUDA: float16 always,
    bfloat16 only at compute capability >= 8.0. Apple MPS: float16, and bfloat16 (the profile keeps it only where
    it measures fast; older macOS releases refuse it).
    """
    device = torch.device(device)
    if device.type == "cpu":
        return [torch.float32, torch.bfloat16]
    if device.type == "cuda":
        return [torch.float32, *([torch.bfloat16] if cuda_bfloat16(device, capability) else []), torch.float16]
    return [torch.float32, torch.float16, torch.bfloat16]


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device,
               capability: tuple[int, int] | None = None) -> torch.dtype:
    """float32 unless asked, except on CUDA: bfloat16 from compute capability 8.0, float16 below it (a T4 only
    emulates bfloat16; ``load_model`` probes it and falls back to float32 where it overflows). The lessons ask for
    float32 everywhere; never assume a dtype is faster: measure it."""
    if dtype is None:
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if cuda_bfloat16(device, capability) else torch.float16
    if isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    resolved = getattr(torch, aliases.get(dtype, dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return resolved


HALF_DTYPES = (torch.float16, torch.bfloat16)


class HalfPrecisionError(RuntimeError):
    """A half-precision dtype gives this model non-finite logits on this device (float16 overflow)."""


def probe_ids(vocab_size: int, tokens: int = 32) -> torch.Tensor:
    """Fixed token ids for a probe forward: no tokenizer needed, the same ones on every machine."""
    return (torch.arange(1, tokens + 1) * 7919 % vocab_size).unsqueeze(0)


@torch.inference_mode()
def finite_logits(model, ids: torch.Tensor | None = None) -> bool:
    """Whether one short forward gives finite logits. Models trained in bfloat16 (Qwen2 among them) can overflow
    to inf/NaN in float16, on pre-Ampere GPUs such as the T4 (QwenLM/Qwen3 issues 761, 826, 868): probe before
    trusting a half dtype."""
    ids = probe_ids(model.config.vocab_size) if ids is None else ids
    logits = model(input_ids=ids.to(model.device), use_cache=False).logits
    return bool(torch.isfinite(logits).all())


def settle_dtype(model, dtype: torch.dtype, requested, name: str, verbose: bool = True):
    """(model, dtype) after probing a half dtype (``finite_logits``). One chosen by default falls back to float32,
    said in one line; one asked for by name raises ``HalfPrecisionError`` (a run in it would score NaN)."""
    if dtype not in HALF_DTYPES or finite_logits(model):
        return model, dtype
    shown = str(dtype).removeprefix("torch.")
    if requested is not None:
        raise HalfPrecisionError(f"{name} gives non-finite logits in {shown} on {model.device.type} (half-precision "
                                 "overflow): use float32, or bfloat16 on a GPU that has it")
    if verbose:
        print(f"{name}: {shown} gave non-finite logits in a probe forward (half-precision overflow): using float32")
    return model.float(), torch.float32


def is_out_of_memory(error: BaseException) -> bool:
    """A device running out of memory: CUDA's ``OutOfMemoryError``, or MPS's RuntimeError that says so."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower())


def free_memory(device: torch.device | str) -> None:
    """Hand a GPU's cached blocks back after a failed or finished large run (nothing to do on a CPU)."""
    import gc

    gc.collect()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
