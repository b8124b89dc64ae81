# TPU image: the train step on Cloud TPU VMs (Vertex AI custom jobs with machine type cloud-tpu or ct5lp-*).
# Build from the project root: docker build --network host -f containers/tpu.Dockerfile -t tpu-mlm-tpu:latest .
# It needs PyPI only (tensorflow-tpu and libtpu are published there). About 2.9 GB (tf2.19: 2.2 GB).
# RUNTIME picks the TensorFlow/libtpu pair by its pins (make tpu-image TPU_RUNTIME=...): tf2.20, the default,
# tensorflow-tpu 2.20.0 + libtpu 0.0.14 from the project's constraints.txt; tf2.19, tensorflow-tpu 2.19.1 + libtpu
# 0.0.10 from containers/tpu-tf2.19.constraints.txt (--build-arg RUNTIME=tf2.19 -t tpu-mlm-tpu-tf2.19:latest).
FROM python:3.11-slim
# The lines from here to the shared layer are the CPU image's first lines too (containers/pins.sh): built at the
# default RUNTIME, both images share that layer.
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

# FORCE_TF_AVAILABLE: transformers 4.57 decides that TensorFlow is installed from the installed distribution's
#   name, and its list of names has no "tensorflow-tpu"; without it is_tf_available() is False and the TF
#   model classes refuse to load. It is transformers' own switch for this case.
# NEXT_PLUGGABLE_DEVICE_USE_C_API + TF_PLUGGABLE_DEVICE_LIBRARY_PATH: TensorFlow's PJRT TPU runtime (the
#   -pjrt TPU software versions; the only runtime v5e has, one of two for v3), loaded from libtpu.so.
# TPU_LIBRARY_PATH: where TensorFlow's TPU initialisation loads libtpu.so from otherwise.
ENV FORCE_TF_AVAILABLE=1 \
    NEXT_PLUGGABLE_DEVICE_USE_C_API=true \
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so \
    TPU_LIBRARY_PATH=/lib/libtpu.so

# tensorflow-tpu (its own TensorFlow build, so `tensorflow` itself is never installed) and the libtpu build it
# names, from the runtime's pins (the pins file says which and why).
RUN sh containers/pins.sh tpu > /tmp/pins.txt && pip install --no-deps -r /tmp/pins.txt \
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
    -u TPU_LIBRARY_PATH TPU_LOAD_LIBRARY=0 python -c "import transformers, pipelines.steps, pipelines.kfp_components; \
assert transformers.is_tf_available(), 'transformers does not see TensorFlow'; \
from transformers import RobertaConfig, TFAutoModelForMaskedLM, create_optimizer; \
TFAutoModelForMaskedLM.from_config(RobertaConfig(vocab_size=64, hidden_size=8, num_hidden_layers=1, \
num_attention_heads=1, intermediate_size=16)); create_optimizer(1e-4, num_train_steps=10, num_warmup_steps=1)"

CMD ["tpu-mlm", "train", "--help"]
