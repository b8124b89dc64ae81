"""Model configurations and their arithmetic: parameters and model FLOPs.

Model configs: presets that need no network (``tiny`` for tests, ``mini`` for the first local run, ``roberta-base`` and
``roberta-large`` with their published sizes), a ``config.json`` (local or ``gs://``), or a Hub model name.
The vocabulary size, the special-token ids and the position embeddings always come from the tokenizer and
the shards, never from the preset (the reference recipe left ``pad_token_id`` wrong).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.recipe import MODEL_DROPOUT

log = logging.getLogger("tpu_mlm.modeling")

MIN_LENGTH, MAX_LENGTH = 8, 8192


@dataclass(kw_only=True)
class SampleLength:
    """Tokens per sample, declared once: the shards', the estimate's and the smoke test's (the training reads the
    shards'). A model's positions bound it: ``model_config``'s, and a continued model's (``base_model.
    check_positions``)."""

    max_length: int = field(
        default=128,
        metadata={
            "help": f"Tokens per sample, from {MIN_LENGTH} to {MAX_LENGTH} (the reference recipe's 128); a model "
            "continued (init_from) takes at most its positions (roberta-base's: 512)."
        },
    )

    def check_sample_length(self) -> None:
        if not MIN_LENGTH <= self.max_length <= MAX_LENGTH:
            raise InvalidParameter("max_length", self.max_length, f"must be from {MIN_LENGTH} to {MAX_LENGTH} tokens")


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
    # the first local run's (run-local): wider than tiny, and without dropout, which only slows a run of minutes
    # on a small corpus that it cannot overfit in that time
    "mini": {
        **_ROBERTA,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
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
    if values["model_type"] in POSITIONS_AFTER_PAD and (
        special.get("pad") != 1 or special.get("bos") is None or special.get("eos") is None
    ):  # TensorFlow's RoBERTa numbers positions from a padding id of 1, whatever the config says
        raise InvalidParameter(
            "model_config",
            name_or_uri,
            f"is a {values['model_type']} model, which needs a tokenizer with <s>, </s> and <pad> at id 1 (the "
            f"tokenizer step's); the shards' has {special}: continue that tokenizer's own model with init_from instead",
        )
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


DROPOUT_SETTINGS = ("hidden_dropout_prob", "attention_probs_dropout_prob")


def pretraining_config(config: Any, dropout: float) -> Any:
    """``config`` with the hidden and attention dropout the pre-training uses: ``dropout``, or the config's own
    where it is ``MODEL_DROPOUT``. The model built from it keeps these rates in its layers; the train
    step saves the original config, so that fine-tuning gets the config's dropout."""
    if dropout == MODEL_DROPOUT:
        return config
    missing = [name for name in DROPOUT_SETTINGS if not hasattr(config, name)]
    if missing:
        raise InvalidParameter(
            "dropout", dropout, f"the {config.model_type} config has no {' or '.join(missing)}; use -1 (its own)"
        )
    return config.__class__.from_dict({**config.to_dict(), **dict.fromkeys(DROPOUT_SETTINGS, dropout)})


def training_flops_per_token(config: Any, num_parameters: int, sequence_length: int) -> float:
    """Model FLOPs of one training token: 6 per parameter (forward and backward matmuls) plus attention's
    12 x layers x hidden x sequence length (the PaLM paper's accounting, used for MFU)."""
    return 6 * num_parameters + 12 * config.num_hidden_layers * config.hidden_size * sequence_length


def executed_flops_per_sample(config: Any, max_length: int, predictions: int) -> float:
    """Training FLOPs of one sample as the train step computes it (BERT layout): the encoder's matmuls at every
    position (6 FLOPs a weight, forward and backward, plus attention's), the LM head's dense layer and its decoder
    only at the ``predictions`` positions it is sized for (``masked_lm.max_predictions``). Unlike the model FLOPs
    of MFU (6 a parameter at every token), this moves with the masking rate that sizes the head: what recipes
    that mask more are compared by."""
    h, layers = config.hidden_size, config.num_hidden_layers
    encoder_weights = layers * (4 * h * h + 2 * h * config.intermediate_size)
    head_weights = h * h + h * config.vocab_size
    attention = 12 * layers * h * max_length * max_length
    return 6 * encoder_weights * max_length + attention + 6 * head_weights * predictions


# Model types whose TensorFlow models number positions from a padding id of 1 + 1 (RoBERTa's convention), not from 0
POSITIONS_AFTER_PAD = ("roberta", "xlm-roberta", "camembert")
# Model types laid out as BERT: embeddings (word, position, token type), post-LayerNorm encoder layers, and an LM
# head of dense + LayerNorm + decoder tied to the word embeddings.
BERT_LAYOUT = ("roberta", "bert", "xlm-roberta", "camembert")


def count_parameters(config: Any) -> int:
    """Trainable parameters of the masked-LM model for ``config``, without building it (preflight runs on a
    small CPU machine): counted from the layout for BERT-like models, else by building it on the CPU."""
    if config.model_type in BERT_LAYOUT:
        h, i, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
        embeddings = (vocab + config.max_position_embeddings + config.type_vocab_size) * h + 2 * h
        attention = 4 * (h * h + h) + 2 * h
        feed_forward = (h * i + i) + (i * h + h) + 2 * h
        head = (h * h + h) + 2 * h + vocab  # the decoder's weights are the word embeddings
        return embeddings + config.num_hidden_layers * (attention + feed_forward) + head
    from transformers import TFAutoModelForMaskedLM

    model = TFAutoModelForMaskedLM.from_config(config)
    model(model.dummy_inputs, training=False)
    return int(sum(math.prod(variable.shape) for variable in model.trainable_variables))
