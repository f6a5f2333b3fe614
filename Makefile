# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv and install torch 2.13.0 (CPU wheel) before the package,
# so that pip never resolves an unpinned torch with gigabytes of CUDA wheels.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: demo test docs lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,docs,dp,flower,app]"
	touch $(STAMP)

# The dashboard's real-browser test drives Debian's Chromium (never `playwright install`).
$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq chromium

demo: $(STAMP)
	$(PY) -m fednovelty.cli demo

test: $(STAMP) $(CHROMIUM)
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 --dist loadfile -q

# The CUDA lane (tests/detectors/test_cuda_lane.py): every registry method fitted on CUDA scores as on the CPU.
# Needs a machine where torch sees a GPU; elsewhere its tests are skipped.
.PHONY: test-cuda
test-cuda: $(STAMP)
	$(PY) -m pytest -m cuda -q tests/detectors/test_cuda_lane.py

# The documentation site at http://127.0.0.1:8000 (mkdocs.yml), rebuilt on every save.
docs: $(STAMP)
	$(PY) -m mkdocs serve

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) -m benchmarks.bench_mixture

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
