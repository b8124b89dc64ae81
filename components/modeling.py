"""Model configurations, the distribution strategy, and the arithmetic of model FLOPs.

Model configs: presets that need no network (``tiny`` for local runs, ``roberta-base`` and
``roberta-large`` with their published sizes), a ``config.json`` (local or ``gs://``), or a Hub model name.
The vocabulary size, the special-token ids and the position embeddings always come from the tokenizer and
the shards, never from the preset (the reference recipe left ``pad_token_id`` wrong).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from components import storage
from components.errors import InvalidParameter

log = logging.getLogger("tpu_mlm.modeling")

_ROBERTA = {
    "model_type": "roberta",
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "initializer_range": 0.02,
}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {**_ROBERTA, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256},
    "roberta-base": {
        **_ROBERTA,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
    "roberta-large": {
        **_ROBERTA,
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
}

# Peak dense bf16 (fp16 where the chip has no bf16) TFLOP/s of one replica of tf.distribute: a TPU v3 core
# (a v3-8 has 8), a TPU v4 or v5e chip, a GPU. Published figures of Google and NVIDIA.
PEAK_TFLOPS_PER_REPLICA = {
    "TPU_V3": 61.5,
    "TPU_V4": 275.0,
    "TPU_V5E": 197.0,
    "NVIDIA_A100": 312.0,
    "NVIDIA_H100": 989.0,
    "NVIDIA_L4": 121.0,
    "NVIDIA_V100": 125.0,
    "NVIDIA_T4": 65.0,
}


def model_config(name_or_uri: str, manifest: dict[str, Any]) -> Any:
    """The model config for ``name_or_uri`` fitted to the shards' tokenizer and sample length."""
    from transformers import AutoConfig

    if name_or_uri in PRESETS:
        values = dict(PRESETS[name_or_uri])
    elif name_or_uri.endswith(".json"):
        storage.check_uri("model_config", name_or_uri)
        if not storage.exists(name_or_uri):
            raise InvalidParameter("model_config", name_or_uri, "no such config.json")
        values = json.loads(storage.read_text(name_or_uri))
    else:
        if "/" not in name_or_uri:
            raise InvalidParameter(
                "model_config",
                name_or_uri,
                f"unknown preset; use one of {sorted(PRESETS)}, a config.json path or URI, or a Hub model name",
            )
        try:
            values = AutoConfig.from_pretrained(name_or_uri).to_dict()
        except OSError as error:
            raise InvalidParameter("model_config", name_or_uri, f"cannot load it from the Hub: {error}") from error
    if "model_type" not in values:
        raise InvalidParameter("model_config", name_or_uri, "the config has no model_type")
    special = manifest["special_tokens"]
    values.update(
        vocab_size=manifest["vocab_size"],
        pad_token_id=special["pad"],
        bos_token_id=special["bos"],
        eos_token_id=special["eos"],
    )
    # RoBERTa numbers positions from pad_token_id + 1, so a sample of n tokens needs n + pad + 1 of them.
    needed = manifest["max_length"] + special["pad"] + 1
    if name_or_uri in PRESETS:
        values["max_position_embeddings"] = max(values["max_position_embeddings"], needed)
    elif values.get("max_position_embeddings", needed) < needed:
        raise InvalidParameter(
            "model_config",
            name_or_uri,
            f"has {values['max_position_embeddings']} position embeddings, too few for shards of "
            f"max_length {manifest['max_length']} (needs {needed})",
        )
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)


def select_strategy(accelerator: str, tpu: str = "local") -> tuple[Any, str]:
    """The ``tf.distribute`` strategy for ``accelerator`` (auto, tpu, gpu, cpu) and the kind found.

    ``auto`` tries a TPU, then GPUs, then the CPU, and says in one line what it fell back to. An explicit
    ``tpu`` or ``gpu`` that is not there is an error, never a silent run on the CPU."""
    import tensorflow as tf

    if accelerator in ("auto", "tpu"):
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            return tf.distribute.TPUStrategy(resolver), "tpu"
        except (ValueError, tf.errors.NotFoundError, tf.errors.UnavailableError) as error:
            if accelerator == "tpu":
                raise InvalidParameter(
                    "accelerator", accelerator, f"no TPU found at --tpu={tpu!r} ({str(error).splitlines()[0]})"
                ) from error
    gpus = tf.config.list_physical_devices("GPU")
    if accelerator in ("auto", "gpu"):
        if gpus:
            if accelerator == "auto":
                log.info("accelerator auto: no TPU found; training on %d GPU(s)", len(gpus))
            return tf.distribute.MirroredStrategy(), "gpu"
        if accelerator == "gpu":
            raise InvalidParameter("accelerator", accelerator, "no GPU is visible to TensorFlow")
        log.info("accelerator auto: no TPU and no GPU found; training on the CPU")
    return tf.distribute.OneDeviceStrategy("/cpu:0"), "cpu"


def peak_tflops_per_replica(kind: str, override: float | None = None) -> float | None:
    """The accelerator's peak, from ``override``, else from ``TPU_ACCELERATOR_TYPE`` (set on TPU VMs) or the
    GPU's name; None when unknown (the CPU)."""
    if override:
        return override
    if kind == "tpu":
        accelerator_type = os.environ.get("TPU_ACCELERATOR_TYPE", "").lower()
        for prefix, key in (("v3", "TPU_V3"), ("v4", "TPU_V4"), ("v5litepod", "TPU_V5E"), ("v5e", "TPU_V5E")):
            if accelerator_type.startswith(prefix):
                return PEAK_TFLOPS_PER_REPLICA[key]
    if kind == "gpu":
        import tensorflow as tf

        name = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
            "device_name", ""
        )
        for key, peak in PEAK_TFLOPS_PER_REPLICA.items():
            if key.startswith("NVIDIA_") and key.removeprefix("NVIDIA_") in name.upper():
                return peak
    return None


def training_flops_per_token(config: Any, num_parameters: int, sequence_length: int) -> float:
    """Model FLOPs of one training token: 6 per parameter (forward and backward matmuls) plus attention's
    12 x layers x hidden x sequence length (the PaLM paper's accounting, used for MFU)."""
    return 6 * num_parameters + 12 * config.num_hidden_layers * config.hidden_size * sequence_length
