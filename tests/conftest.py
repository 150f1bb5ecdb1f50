"""Shared fixtures: every test runs offline, on the embedded model or a two-layer random twin of each architecture
(Qwen2, Llama), on the CPU (also on a machine with a GPU: the tests marked ``gpu`` in test_gpu.py ask for the
accelerator themselves)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Under pytest-xdist (make test runs a worker per core), each worker, and the notebook kernels and subprocesses it
# starts, computes on its share of the cores: two workers of two threads each would fight over two cores.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import pytest

from helpers.data import LABELS, build_prompt, few_shot_examples, make_tickets
from helpers.models import load_model

# Small sizes: every check runs on every item, the whole suite in minutes on 2 cores.
N_TICKETS = 16


@pytest.fixture(autouse=True)
def cpu_unless_marked_gpu(request, monkeypatch):
    """Every test runs on the CPU (notebook kernels and subprocesses inherit $SLM_DEVICE), so the suite means the same
    on every machine; the ``gpu`` tests choose the accelerator."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("SLM_DEVICE", "cpu")


@pytest.fixture(scope="session")
def embedded():
    return load_model("embedded", device="cpu", verbose=False)


@pytest.fixture(scope="session")
def tiny_qwen():
    return load_model("twin:tiny-qwen2", device="cpu", verbose=False)


@pytest.fixture(scope="session")
def tiny_llama():
    return load_model("twin:tiny-llama", device="cpu", verbose=False)


@pytest.fixture(scope="session", params=["tiny_llama", "tiny_qwen"])
def any_model(request):
    """Both architectures (Llama, as in the embedded SmolLM2, and Qwen2), two layers each: the exactness checks run on
    every item in a fraction of a second, and the twins see position and mask errors as a real model does
    (test_models.py). The tests that need trained weights or the real model's numbers ask for ``embedded``."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def tickets():
    return make_tickets(N_TICKETS, style="varied")


@pytest.fixture(scope="session")
def few_shot():
    return few_shot_examples(3)


def prompts_for(tokenizer, texts, examples=()):
    return [build_prompt(tokenizer, text, LABELS, examples) for text in texts]
