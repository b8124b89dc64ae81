# make install   create .venv with the pinned dependencies (pyproject.toml + constraints.txt)
# make run       the main job on the embedded corpus: tokenizer, then train and validation shards
# make test      ruff, then the whole test suite (slow tests included)
# make bench     the sharding throughput benchmark on WikiText-2 (../shared/data)
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
OUT ?= outputs
VOCAB_SIZE ?= 5000

.PHONY: install run test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

run: install
	$(BIN)/tpu-mlm tokenizer --corpus embedded --vocab_size $(VOCAB_SIZE) --output $(OUT)/tokenizer
	$(BIN)/tpu-mlm shards --corpus embedded --tokenizer $(OUT)/tokenizer --output $(OUT)/shards/train \
		--split train --holdout_fraction 0.05 --holdout exclude
	$(BIN)/tpu-mlm shards --corpus embedded --tokenizer $(OUT)/tokenizer --output $(OUT)/shards/validation \
		--split validation --holdout_fraction 0.05 --holdout only

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python benchmarks/shard_throughput.py

clean:
	rm -rf $(OUT) .pytest_cache .ruff_cache
