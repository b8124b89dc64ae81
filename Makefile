# make install   create .venv with the pinned dependencies (pyproject.toml + constraints.txt)
# make run       the whole pipeline under kfp.local on the embedded corpus (mini model, about 3 minutes)
# make prepare   only the data steps: tokenizer, train and validation shards into outputs/
# make docs      write the README's table of pipeline parameters from the dataclasses
# make compile   compile the pipeline for kfp.local (see the README for the Vertex target)
# make test      ruff, then the whole test suite (slow tests included): what CI runs
# make test-fast ruff, then the tests not marked slow (no Docker, no whole pipelines), while working
# make bench     the sharding, training and parts-reading benchmarks on WikiText-2 (../shared/data)
# make images    build and tag the CPU and TPU images (make cpu-image: the CPU one alone)
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
OUT ?= outputs
RUNS ?= runs
VOCAB_SIZE ?= 5000

CPU_IMAGE ?= tpu-mlm-cpu:latest
TPU_IMAGE ?= tpu-mlm-tpu:latest

.PHONY: install run prepare docs compile test test-fast lint bench images cpu-image tpu-image clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

run: install
	$(BIN)/tpu-mlm run-local --pipeline_root $(RUNS)

prepare: install
	$(BIN)/tpu-mlm tokenizer --corpus embedded --vocab_size $(VOCAB_SIZE) --output $(OUT)/tokenizer
	$(BIN)/tpu-mlm shards --corpus embedded --tokenizer $(OUT)/tokenizer --output $(OUT)/shards/train \
		--split train --holdout_fraction 0.05 --holdout exclude
	$(BIN)/tpu-mlm shards --corpus embedded --tokenizer $(OUT)/tokenizer --output $(OUT)/shards/validation \
		--split validation --holdout_fraction 0.05 --holdout only

docs: install
	$(BIN)/python -m pipelines.docs README.md

compile: install
	$(BIN)/tpu-mlm compile --target local --output $(OUT)/pipeline-local.yaml

images: cpu-image tpu-image

cpu-image:
	docker build --network host -f containers/cpu.Dockerfile -t $(CPU_IMAGE) .

tpu-image:
	docker build --network host -f containers/tpu.Dockerfile -t $(TPU_IMAGE) .

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest

test-fast: lint
	$(BIN)/python -m pytest -m "not slow"

bench: install
	$(BIN)/python benchmarks/shard_throughput.py
	$(BIN)/python benchmarks/train_throughput.py
	$(BIN)/python benchmarks/parts_read.py

clean:
	rm -rf $(OUT) $(RUNS) .pytest_cache .ruff_cache
