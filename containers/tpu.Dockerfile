# TPU image: the train step on Cloud TPU VMs (Vertex AI custom jobs with machine type cloud-tpu or ct5lp-*).
# tensorflow-tpu brings its own TensorFlow build and libtpu; `tensorflow` itself must not be installed beside it,
# so everything is installed from the project's resolved pins without resolution, TensorFlow swapped for it.
# It cannot be built on the project's development machines; build it where PyPI is reachable:
#   docker build -f containers/tpu.Dockerfile -t tpu-mlm-tpu:latest .
FROM python:3.11-slim

ARG TENSORFLOW_TPU_VERSION=2.20.0
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    TF_USE_LEGACY_KERAS=1 \
    PJRT_DEVICE=TPU \
    NEXT_PLUGGABLE_DEVICE_USE_C_API=true \
    TPU_LIBRARY_PATH=/usr/local/lib/python3.11/site-packages/libtpu/libtpu.so \
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/usr/local/lib/python3.11/site-packages/libtpu/libtpu.so

WORKDIR /opt/tpu-mlm
RUN pip install "tensorflow-tpu==${TENSORFLOW_TPU_VERSION}" \
    -f https://storage.googleapis.com/libtpu-tf-releases/index.html
COPY constraints.txt ./
RUN grep -vE '^(tensorflow|pytest|ruff|gcp-storage-emulator|iniconfig|pluggy)==' constraints.txt > /tmp/runtime.txt \
    && pip install --no-deps -r /tmp/runtime.txt
COPY pyproject.toml README.md ./
COPY components components
COPY pipelines pipelines
RUN pip install --no-deps . && python -c "import components.train"

CMD ["tpu-mlm", "train", "--help"]
