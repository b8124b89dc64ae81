# CPU image: tokenizer, shards, evaluate and push steps (and training where no TPU is used).
# Build from the project root: docker build -f containers/cpu.Dockerfile -t tpu-mlm-cpu:latest .
FROM python:3.11-slim
# Dependencies first (the slow layers), from the project's fully resolved pins, without resolution.
# The lines from here to the shared layer are the TPU image's first lines too (containers/pins.sh): built at the
# default RUNTIME, as this image is, both images share that layer.
ARG RUNTIME=tf2.20
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    TF_USE_LEGACY_KERAS=1
WORKDIR /opt/tpu-mlm
COPY constraints.txt ./
COPY containers/pins.sh containers/tpu-*.constraints.txt containers/
RUN sh containers/pins.sh common > /tmp/pins.txt && pip install --no-deps -r /tmp/pins.txt
# End of the shared layer.
RUN sh containers/pins.sh tensorflow > /tmp/pins.txt && pip install --no-deps -r /tmp/pins.txt
COPY pyproject.toml README.md ./
COPY components components
COPY pipelines pipelines
RUN pip install --no-deps . && python -c "import pipelines.steps, pipelines.kfp_components, pipelines.pipeline"

CMD ["tpu-mlm", "--help"]
