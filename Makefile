# The two commands: `make demo` (train on 2 processes) and `make test`.
# Both install first when needed; scripts/install.sh holds every version pin.
VENV   ?= .venv
NP     ?= 2
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hvdkit-installed
DEMO_ARGS ?= --dataset digits
PYTEST_ARGS ?=

export TF_CPP_MIN_LOG_LEVEL ?= 3
export PATH := $(abspath $(BIN)):$(PATH)

GPU_VENV ?= .venv-gpu

.PHONY: install install-gpu demo lint test test-unit test-adapters test-cli test-multiproc test-multihost test-image \
	env bench clean

install: $(STAMP)

$(STAMP): scripts/install.sh scripts/patches/*.patch pyproject.toml
	HVDKIT_VENV=$(VENV) bash scripts/install.sh --cpu

install-gpu:
	HVDKIT_VENV=$(GPU_VENV) bash scripts/install.sh --gpu

demo: $(STAMP)
	$(BIN)/horovodrun -np $(NP) -H localhost:$(NP) --gloo $(BIN)/python examples/pytorch_mnist.py $(DEMO_ARGS)

# ruff's rules are in pyproject.toml; `make test` lints first, so CI does too.
lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -m "not container" $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -m unit $(PYTEST_ARGS)

test-adapters: $(STAMP)
	$(BIN)/python -m pytest -m adapters $(PYTEST_ARGS)

test-cli: $(STAMP)
	$(BIN)/python -m pytest -m cli $(PYTEST_ARGS)

test-multihost: $(STAMP)
	$(BIN)/python -m pytest -m multihost $(PYTEST_ARGS)

test-multiproc: $(STAMP)
	$(BIN)/python -m pytest -m multiproc $(PYTEST_ARGS)

# The GPU image without a GPU (root, about 30 min on 2 cores): a Docker engine started by hand,
# Dockerfile.gpu built unmodified on a Debian 12 stand-in for NVIDIA's base, the image checked
# (this build is the run's one compile of Horovod with NCCL), the compose cpu cluster trained.
test-image: $(STAMP)
	bash scripts/install.sh --container-tools
	$(BIN)/python -m pytest -m container $(PYTEST_ARGS)

env: $(STAMP)
	$(BIN)/hvdkit env

# The numbers in docs/BENCHMARKS.md: every implementation side by side (about 25 min on 2 cores).
bench: $(STAMP)
	$(BIN)/hvdkit bench allreduce -np $(NP) --out docs/bench
	$(BIN)/hvdkit bench train -np 1,$(NP) --repeats 3 --steps 20 --out docs/bench

clean:
	rm -rf $(VENV) $(GPU_VENV) .pytest_cache build *.egg-info
