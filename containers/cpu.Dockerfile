# CPU image: tokenizer, shards, evaluate and push steps (and training where no TPU is used).
# Build from the project root: docker build -f containers/cpu.Dockerfile -t tpu-mlm-cpu:latest .
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    TF_USE_LEGACY_KERAS=1

WORKDIR /opt/tpu-mlm
# Dependencies first (the slow layer), from the project's fully resolved pins.
COPY constraints.txt ./
RUN grep -vE '^(tensorflow-tpu|libtpu|pytest|pytest-timeout|ruff|gcp-storage-emulator|iniconfig|pluggy)==' constraints.txt > /tmp/runtime.txt \
    && pip install --no-deps -r /tmp/runtime.txt
COPY pyproject.toml README.md ./
COPY components components
COPY pipelines pipelines
RUN pip install --no-deps . && python -c "import pipelines.steps, pipelines.pipeline"

CMD ["tpu-mlm", "--help"]
