import time

import pytest
import torch

from helpers import models
from helpers.checks import float_tolerance
from helpers.models import convert_embedded, load_model, load_tokenizer, pick_dtype


def test_embedded_model_loads_with_a_record(embedded):
    model, tokenizer, info = embedded
    assert info.name.startswith("SmolLM2-135M-Instruct")
    assert 130e6 < info.n_params < 140e6
    assert (info.dtype, info.device) == ("float32", "cpu")
    assert info.threads >= 1 and info.fallback_reason is None
    assert model.config.model_type == "llama"


def test_tokenizer_is_prepared_for_left_padded_batches(embedded):
    _, tokenizer, _ = embedded
    assert tokenizer.pad_token is not None
    assert tokenizer.padding_side == "left"


def test_default_falls_back_to_the_embedded_model_quickly_and_says_why(monkeypatch, capsys):
    monkeypatch.delenv("SLM_MODEL", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "_hub_cached", lambda name: False)
    start = time.perf_counter()
    assert models.resolve_name()[0] == models.EMBEDDED
    assert time.perf_counter() - start < 5, "the offline fallback decision must not wait on the network"
    _, _, info = load_model()
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and "Qwen/Qwen2.5-0.5B-Instruct" in printed[0] and "embedded" in printed[0]
    assert info.fallback_reason and "HF_HUB_OFFLINE" in info.fallback_reason


def test_load_models_lines_go_to_say_and_none_to_stdout(monkeypatch, capsys):
    """classify routes them to its own stream (its stdout may be the job's output); a notebook keeps print."""
    monkeypatch.setattr(models, "resolve_name", lambda name=None: ("twin:tiny-qwen2", "not reachable"))
    said = []
    load_model(device="cpu", say=said.append)
    monkeypatch.setattr(models, "finite_logits", lambda model, ids=None: False)  # a default half dtype overflows
    _, dtype = models.settle_dtype(torch.nn.Linear(2, 2).bfloat16(), torch.bfloat16, None, "a twin", say=said.append)
    assert dtype == torch.float32 and capsys.readouterr().out == ""
    assert "not reachable" in said[0] and "using float32" in said[1] and len(said) == 2, said


def test_unreachable_hub_is_decided_within_the_probe_timeout(monkeypatch):
    monkeypatch.delenv("SLM_MODEL", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_hub_cached", lambda name: False)
    monkeypatch.setattr(models, "HUB_PROBE_TIMEOUT_S", 0.5)
    expected = (models.EMBEDDED, "not in the local Hugging Face cache and the hub is unreachable")
    # A refused connection (nothing listens on loopback port 1) ...
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    models._hub_reachable.cache_clear()
    assert models.resolve_name() == expected

    # ... and one that hangs (DNS or a silent firewall) are both decided within the timeout.
    def hang(*args, **kwargs):
        time.sleep(3)
        raise OSError("timed out")

    monkeypatch.setattr(models.socket, "create_connection", hang)
    models._hub_reachable.cache_clear()  # a process probes once per endpoint: forget the refused one
    start = time.perf_counter()
    assert models.resolve_name() == expected
    assert time.perf_counter() - start < 2.5, "a 0.5 s probe must not wait for the 3 s hang"


def test_explicit_names_never_fall_back(monkeypatch):
    monkeypatch.setenv("SLM_MODEL", "embedded")
    assert models.resolve_name() == ("embedded", None)
    assert models.resolve_name("some/model") == ("some/model", None)
    with pytest.raises(RuntimeError, match="cannot load model '/no/such/model'"):
        load_model("/no/such/model", verbose=False)
    with pytest.raises(ValueError, match="unknown twin"):
        load_model("twin:gpt-9", verbose=False)


def test_dtype_names_are_resolved_and_bad_ones_refused():
    cpu = torch.device("cpu")
    assert pick_dtype(None, cpu) == torch.float32
    assert pick_dtype(None, torch.device("mps")) == torch.float32
    assert pick_dtype("bf16", cpu) == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'float7'"):
        pick_dtype("float7", cpu)


@pytest.mark.parametrize(
    "capability, default, candidates",
    [
        ((7, 5), torch.float16, [torch.float32, torch.float16]),  # a T4 (Colab, Kaggle): bfloat16 only emulated
        ((7, 0), torch.float16, [torch.float32, torch.float16]),  # a V100
        ((8, 0), torch.bfloat16, [torch.float32, torch.bfloat16, torch.float16]),  # an A100
        ((9, 0), torch.bfloat16, [torch.float32, torch.bfloat16, torch.float16]),  # an H100 / H200
    ],
)
def test_cuda_dtypes_follow_the_compute_capability(capability, default, candidates):
    cuda = torch.device("cuda")
    assert pick_dtype(None, cuda, capability=capability) == default
    assert models.dtype_candidates(cuda, capability=capability) == candidates
    assert pick_dtype("float32", cuda, capability=capability) == torch.float32, "an explicit dtype always wins"


def test_cpu_and_mps_dtype_candidates():
    assert models.dtype_candidates("cpu") == [torch.float32, torch.bfloat16]
    assert models.dtype_candidates("mps") == [torch.float32, torch.float16, torch.bfloat16]


def test_an_unavailable_device_is_a_one_line_error():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="device 'cuda' asked for, but torch sees no CUDA GPU"):
            models.pick_device("cuda")
    assert models.pick_device("cpu") == torch.device("cpu")


def test_the_device_comes_from_the_argument_then_slm_device_then_the_best_available(monkeypatch):
    monkeypatch.setenv("SLM_DEVICE", "cpu")  # e.g. SLM_DEVICE=cpu make notebooks on a GPU machine
    assert models.pick_device() == torch.device("cpu")
    monkeypatch.setenv("SLM_DEVICE", "auto")
    best = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert models.pick_device().type == best and models.pick_device("auto").type == best


def test_threads_are_shared_out_among_the_processes_of_one_machine(monkeypatch):
    monkeypatch.setattr(models, "cpu_threads", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert models.process_threads() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # e.g. torchrun --nproc_per_node 4 on a 4-GPU box
    assert models.process_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert models.process_threads() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # a cap the user set: honoured, never raised
    assert models.process_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    assert models.process_threads() == 16


def test_converted_cache_is_reused():
    path = convert_embedded()
    stamp = (path / "model.safetensors").stat().st_mtime
    assert convert_embedded() == path
    tokenizer = load_tokenizer("embedded")
    _, loaded, _ = load_model("embedded", verbose=False, tokenizer=tokenizer)  # classify's: loaded once, not twice
    assert loaded is tokenizer
    assert (path / "model.safetensors").stat().st_mtime == stamp, "the cache must not be rewritten"


@pytest.mark.parametrize("threads", [1, 2])
def test_converted_model_gives_the_gguf_models_logits(embedded, threads):
    """The conversion is only a faster way to load: same weights, same logits. The GGUF model's logits on a probe
    sentence were saved as it was converted (loading the GGUF again costs most of a minute on 2 cores), at another
    thread count or on another CPU, perhaps: float32 sums in another order there, so within float_tolerance."""
    from safetensors.torch import load_file

    probe = load_file(convert_embedded() / models.PROBE)
    converted, tokenizer, _ = embedded
    assert tokenizer.decode(probe["input_ids"][0]) == "The app crashes when I open settings."
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            logits = converted(probe["input_ids"]).logits
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(logits, probe["logits"], rtol=0, atol=float_tolerance(probe["logits"]))


def test_the_converted_folder_is_a_plain_checkpoint_an_engine_reads_by_tensor_name(embedded):
    """An engine (vLLM) loads every *.safetensors beside config.json, by tensor name, ignoring transformers' tie
    metadata, and ties lm_head to model.embed_tokens.weight itself: the folder holds the embeddings under that name and
    nothing else named *.safetensors (the probe sits in a subfolder). Read that way, by hand, it gives the GGUF
    model's logits; the old layout (lm_head.weight alone) gave an engine zeros and a uniform -10.80 everywhere."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = convert_embedded()
    assert [path.name for path in folder.glob("*.safetensors")] == ["model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    with safe_open(folder / "model.safetensors", "pt") as stored:
        assert set((stored.metadata() or {}).values()) <= {"pt"}, "no tie recorded only in metadata"
    tensors = load_file(folder / "model.safetensors")
    assert "model.embed_tokens.weight" in tensors and "lm_head.weight" not in tensors
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    model.apply(lambda module: [torch.nn.init.zeros_(p) for p in module.parameters(recurse=False)])
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.lm_head.weight = torch.nn.Parameter(tensors["model.embed_tokens.weight"])  # the engine's tie, by name
    probe = load_file(folder / models.PROBE)
    with torch.inference_mode():
        logits = model.eval()(probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], rtol=0, atol=float_tolerance(probe["logits"]))


def test_threads_count_physical_cores_not_smt_siblings(monkeypatch, tmp_path):
    # Four CPUs on two cores (each with its hyper-thread sibling), and a process allowed on three of them.
    for cpu, siblings in enumerate(["0-1", "0-1", "2-3", "2-3"]):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "core_cpus_list").write_text(f"{siblings}\n")
    monkeypatch.setattr(models.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert models.cpu_threads(tmp_path) == 2
    monkeypatch.setattr(models.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert models.cpu_threads(tmp_path) == 1
    # No topology to read: every allowed CPU.
    assert models.cpu_threads(tmp_path / "missing") == 2


@pytest.mark.parametrize("twin", ["tiny_llama", "tiny_qwen"])
def test_the_tiny_twins_see_the_errors_the_exactness_tests_look_for(request, tickets, twin):
    """The agreement tests run on the twins within float_tolerance (128 float32 rounding steps at the scores' scale): a
    wrong relative position (a suffix that does not continue from the cached prefix) or a single attended pad must move
    their label log-probs far beyond it (by more than 100x and 10x; measured at least 425x and 32x), as on a real model.
    (A shift of every position changes nothing under rotary embeddings: only relative positions count.)"""
    from helpers.data import LABELS, build_prompt
    from helpers.scoring import LabelScorer

    model, tokenizer, info = request.getfixturevalue(twin)
    assert info.timing_only and model.config.num_key_value_heads < model.config.num_attention_heads
    first = torch.tensor([ids[0] for ids in LabelScorer(tokenizer, LABELS, method="first_token").label_ids])

    def label_log_probs(ids, **options):
        with torch.inference_mode():
            return model(ids, **options).logits[0, -1].log_softmax(-1)[first]

    for text in tickets["text"][:3]:
        ids = tokenizer(build_prompt(tokenizer, text, LABELS), return_tensors="pt").input_ids
        positions = torch.arange(ids.shape[1])[None]
        exact = label_log_probs(ids, position_ids=positions)
        tolerance = float_tolerance(exact)
        torch.testing.assert_close(label_log_probs(ids, position_ids=positions + 7), exact, rtol=0, atol=tolerance)
        gap = positions.clone()
        gap[0, -20:] += 2  # the ticket's end two positions too far along
        assert (exact - label_log_probs(ids, position_ids=gap)).abs().max() > 100 * tolerance, text
        padded = torch.cat([torch.tensor([[tokenizer.pad_token_id]]), ids], dim=1)
        mask = torch.ones_like(padded)
        mask[0, 0] = 0
        pad_positions = torch.cat([torch.zeros(1, 1, dtype=torch.long), positions], dim=1)
        masked = label_log_probs(padded, attention_mask=mask, position_ids=pad_positions)
        torch.testing.assert_close(masked, exact, rtol=0, atol=tolerance)
        unmasked = label_log_probs(padded, position_ids=pad_positions)
        assert (exact - unmasked).abs().max() > 10 * tolerance, f"unmasked pad: {text}"
