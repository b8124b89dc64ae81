# make install   create .venv with the pinned dependencies (pyproject.toml + constraints.txt)
# make run       the whole pipeline under kfp.local on the embedded corpus (mini model, about 2 minutes)
# make prepare   only the data steps: tokenizer, train and validation shards into outputs/
# make docs      write docs/steps.md's table of pipeline parameters from the dataclasses
# make components  write pipelines/kfp_components.py (the component functions) and pipelines/routes.py (where each
#                  pipeline parameter goes) from the dataclasses
# make compile   compile the pipeline for kfp.local (see the README for the Vertex target)
# make test      ruff, then the whole test suite (slow tests included): what CI runs
# make pytorch-env  the tests' PyTorch environment (.venv-pytorch: tests/pytorch_env.py), which the tests
#                  otherwise make on first use
# make test-fast ruff, then the tests not marked slow (no Docker, no whole pipeline, no test of 3 s or more),
#                  while working: about a minute here
# make bench     the sharding, training, parts-reading and recipe benchmarks on WikiText-2 (../shared/data;
#                the recipes' side by side takes about 45 minutes: benchmarks/recipes.py --quick, about 15)
# make bench-levers  the levers over the default recipe side by side (clipping, no dropout, batch warm-up), 3 seeds,
#                  at both sizes: mini 1,000 steps, l4-h256 300 (about 40 and 75 minutes here; docs/benchmarks.md)
# make images    build and tag the CPU image and both TPU images (make cpu-image, make tpu-image: one alone;
#                make tpu-image TPU_RUNTIME=tf2.19: the TPU image on tensorflow-tpu 2.19.1 + libtpu 0.0.10)
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
OUT ?= outputs
RUNS ?= runs
VOCAB_SIZE ?= 5000

CPU_IMAGE ?= tpu-mlm-cpu:latest
# Vertex AI runs x86-64 machines: an image built for an ARM laptop's own platform fails there ("exec format error")
PLATFORM ?= linux/amd64
# The TPU images' runtimes (containers/tpu.Dockerfile's RUNTIME), the default first; make tpu-image builds
# TPU_RUNTIME's. TPU_IMAGE is the default runtime's image; another's is TPU_IMAGE with -<runtime> after its
# repository: tpu-mlm-tpu-tf2.19:latest, or $REPO/tpu-tf2.19:0.1.0 beside TPU_IMAGE=$REPO/tpu:0.1.0.
TPU_RUNTIMES := tf2.20 tf2.19
TPU_RUNTIME ?= $(firstword $(TPU_RUNTIMES))
TPU_IMAGE ?= tpu-mlm-tpu:latest
tpu_image = $(if $(filter $(firstword $(TPU_RUNTIMES)),$(1)),$(TPU_IMAGE),$(shell echo '$(TPU_IMAGE)' \
	| sed -E 's,^(.*/)?([^/:]+)(:[^/]*)?$$,\1\2-$(1)\3,'))
TPU_IMAGE_TARGETS := $(addprefix tpu-image-,$(TPU_RUNTIMES))
# The tests run in TEST_WORKERS processes (pytest-xdist; 0: in pytest's own), the container tests in one of them
# (they share their images); docs/testing.md has what four buy on two cores.
TEST_WORKERS ?= 4
PYTEST_PROCESSES := -n $(TEST_WORKERS) --dist loadgroup

.PHONY: install pytorch-env run prepare components docs compile test test-fast lint bench bench-levers images cpu-image tpu-image $(TPU_IMAGE_TARGETS) clean

install: $(VENV)/.installed

# uv resolves and installs the same pins as pip in a quarter of the time (docs/testing.md). uv does not read pip's
# settings (pip.conf, PIP_INDEX_URL): behind a package mirror, make install INSTALLER=pip
INSTALLER ?= uv
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
ifeq ($(INSTALLER),uv)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -c constraints.txt -e '.[dev]'
else
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
endif
	touch $@

pytorch-env:
	$(PYTHON) tests/pytorch_env.py

run: install
	$(BIN)/tpu-mlm run-local --pipeline_root $(RUNS)

prepare: install
	$(BIN)/tpu-mlm tokenizer --corpus embedded --vocab_size $(VOCAB_SIZE) --output $(OUT)/tokenizer
	$(BIN)/tpu-mlm shards --corpus embedded --tokenizer $(OUT)/tokenizer --output $(OUT)/shards/train \
		--split train --holdout_fraction 0.05 --holdout exclude
	$(BIN)/tpu-mlm shards --corpus embedded --tokenizer $(OUT)/tokenizer --output $(OUT)/shards/validation \
		--split validation --holdout_fraction 0.05 --holdout only

components: install
	$(BIN)/python -m pipelines.component_source

docs: install
	$(BIN)/python -m pipelines.docs docs/steps.md

compile: install
	$(BIN)/tpu-mlm compile --target local --output $(OUT)/pipeline-local.yaml

images: cpu-image $(TPU_IMAGE_TARGETS)

cpu-image:
	docker build --platform $(PLATFORM) --network host -f containers/cpu.Dockerfile -t $(CPU_IMAGE) .

tpu-image: tpu-image-$(TPU_RUNTIME)

$(TPU_IMAGE_TARGETS): tpu-image-%:
	docker build --platform $(PLATFORM) --network host -f containers/tpu.Dockerfile --build-arg RUNTIME=$* -t $(call tpu_image,$*) .

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest $(PYTEST_PROCESSES)

test-fast: lint
	$(BIN)/python -m pytest $(PYTEST_PROCESSES) -m "not slow"

bench: install
	$(BIN)/python benchmarks/shard_throughput.py
	$(BIN)/python benchmarks/train_throughput.py
	$(BIN)/python benchmarks/parts_read.py
	$(BIN)/python benchmarks/recipes.py

DEFAULT_RECIPE := roberta-2019 + masking 30%->15%
CLIP := $(DEFAULT_RECIPE),$(DEFAULT_RECIPE) + clip 1.0
WARMUP := $(DEFAULT_RECIPE) + batch warm-up
bench-levers: install
	$(BIN)/python benchmarks/recipes.py --candidates "$(CLIP),$(WARMUP)" --long_reference_steps 0 \
		--output benchmarks/results/recipes-levers-mini.json --plot docs/images/recipes-levers-mini.png
	$(BIN)/python benchmarks/recipes.py --model_config l4-h256 --steps 300 --validations 10 --long_reference_steps 0 \
		--candidates "$(CLIP),$(DEFAULT_RECIPE) + dropout 0,$(WARMUP)" \
		--output benchmarks/results/recipes-levers-l4-h256.json --plot docs/images/recipes-levers-l4-h256.png

clean:
	rm -rf $(OUT) $(RUNS) .pytest_cache .ruff_cache
