# TPU image: the train step on Cloud TPU VMs (Vertex AI custom jobs with machine type cloud-tpu or ct5lp-*).
# Build from the project root: docker build --network host -f containers/tpu.Dockerfile -t tpu-mlm-tpu:latest .
# It needs PyPI only (tensorflow-tpu and libtpu are published there). About 4.5 GB.
FROM python:3.11-slim

# FORCE_TF_AVAILABLE: transformers 4.57 decides that TensorFlow is installed from the installed distribution's
#   name, and its list of names has no "tensorflow-tpu"; without it is_tf_available() is False and the TF
#   model classes refuse to load. It is transformers' own switch for this case.
# NEXT_PLUGGABLE_DEVICE_USE_C_API + TF_PLUGGABLE_DEVICE_LIBRARY_PATH: TensorFlow's PJRT TPU runtime (the
#   -pjrt TPU software versions; the only runtime v5e has, one of two for v3), loaded from libtpu.so.
# TPU_LIBRARY_PATH: where TensorFlow's TPU initialisation loads libtpu.so from otherwise.
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    TF_USE_LEGACY_KERAS=1 \
    FORCE_TF_AVAILABLE=1 \
    NEXT_PLUGGABLE_DEVICE_USE_C_API=true \
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so \
    TPU_LIBRARY_PATH=/lib/libtpu.so

WORKDIR /opt/tpu-mlm
# Everything from the project's resolved pins without resolution: tensorflow-tpu (its own TensorFlow build, so
# `tensorflow` itself is left out) and the libtpu build it names (constraints.txt says which and why).
COPY constraints.txt ./
RUN grep -vE '^(tensorflow|pytest|ruff|gcp-storage-emulator|iniconfig|pluggy)==' constraints.txt \
        > /tmp/runtime.txt \
    && pip install --no-deps -r /tmp/runtime.txt \
    && site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
    && mv "$site/libtpu/libtpu.so" /lib/libtpu.so \
    && ln -s /lib/libtpu.so "$site/libtpu/libtpu.so"
# Vertex AI: custom containers "must save libtpu.so in the /lib directory"; the link keeps libtpu's own path.
COPY pyproject.toml README.md ./
COPY components components
COPY pipelines pipelines
# The check builds a model and an optimizer (an import alone passes even where transformers cannot use TF), with
# the TPU runtime left unloaded: off a TPU VM, libtpu waits minutes on the metadata server (see the README).
RUN pip install --no-deps . && env -u TF_PLUGGABLE_DEVICE_LIBRARY_PATH -u NEXT_PLUGGABLE_DEVICE_USE_C_API \
    -u TPU_LIBRARY_PATH TPU_LOAD_LIBRARY=0 python -c "import transformers, pipelines.steps; \
assert transformers.is_tf_available(), 'transformers does not see TensorFlow'; \
from transformers import RobertaConfig, TFAutoModelForMaskedLM, create_optimizer; \
TFAutoModelForMaskedLM.from_config(RobertaConfig(vocab_size=64, hidden_size=8, num_hidden_layers=1, \
num_attention_heads=1, intermediate_size=16)); create_optimizer(1e-4, num_train_steps=10, num_warmup_steps=1)"

CMD ["tpu-mlm", "train", "--help"]
