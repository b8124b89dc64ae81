"""The model a run continues pre-training from (``--init_from``): a Hub model (``hf:NAME[@REVISION]``, a private
one through ``HF_TOKEN``) or a model folder (local or ``gs://``), with its own tokenizer and weights.

Everything about it is checked before any accelerator time (the tokenizer step, preflight and the train step call
``check_base_model``): a config whose model type has a TensorFlow masked-LM model in the pinned transformers, saved
with its masked-LM head; TensorFlow weights (``tf_model.h5``) or PyTorch's safetensors (read with numpy alone); a
fast tokenizer (``tokenizer.json``) with a mask and a pad token whose vocabulary fits the model's embeddings; a
sample length within its positions. The tokenizer step publishes the model's tokenizer as it is instead of training
one, so the shards are made with it; the train step starts from the weights, its masked-LM head included, and keeps
the model's config.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.hub import CARD_FILE, LICENSE_ID, REPO_ID, download_repo, read_token, refused_reads
from components.lib.modeling import BERT_LAYOUT, POSITIONS_AFTER_PAD
from components.lib.pytorch_weights import TF_WEIGHTS_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE

HUB_MODEL_PREFIX = "hf:"
CONFIG_FILE = "config.json"
# the weights a base is loaded from, the first kind it has: TensorFlow's, else PyTorch's safetensors (one file, or
# shards named by their index)
WEIGHT_FILES = ((TF_WEIGHTS_FILE,), (WEIGHTS_FILE,), (WEIGHTS_INDEX_FILE, "model-*-of-*.safetensors"))
# the Hub card's license metadata, each kept only as the Hub spells it: an id, and a link of its own (a file of the
# base's repository is not the continued model's)
LICENSE_VALUES = {
    "license": LICENSE_ID.match,
    "license_name": LICENSE_ID.match,
    "license_link": lambda link: link.startswith("https://"),
}
# a tokenizer folder's files, whatever the tokenizer's kind (byte-level BPE, WordPiece, SentencePiece)
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.model",
)
# the architectures a masked-LM head is saved with (BERT's pre-training head holds its masked-LM head too)
MASKED_LM_HEADS = ("ForMaskedLM", "ForPreTraining")
INIT_FROM_HELP = (
    "Continue pre-training this model instead of starting from scratch: hf:NAME[@REVISION] (a public Hub model; a "
    "private or gated one only for a run on this machine, through HF_TOKEN) or a model folder (local or gs://) with "
    "TensorFlow weights (tf_model.h5) or PyTorch's (model.safetensors), and a fast tokenizer. Its tokenizer is used "
    "as it is (the tokenizer step trains none) and its config replaces model_config. Empty: from scratch."
)


@dataclass(kw_only=True)
class BaseModelChoice:
    """The model a run continues pre-training from: the tokenizer step, preflight and the train step read it."""

    init_from: str = field(default="", metadata={"help": INIT_FROM_HELP})


@dataclass(frozen=True)
class BaseModel:
    """A checked base model: its config and its tokenizer (loaded from a local copy of their files)."""

    source: str
    config: Any
    tokenizer: Any


def check_init_from(value: str) -> None:
    """Refuses an ``init_from`` of no known form, before anything is read."""
    if value.startswith(HUB_MODEL_PREFIX):
        hub_name(value)
    elif value:
        storage.check_uri("init_from", value)


def hub_name(value: str) -> tuple[str, str | None]:
    """The repository id and revision of ``hf:NAME[@REVISION]``."""
    name, _, revision = value[len(HUB_MODEL_PREFIX) :].partition("@")
    if not REPO_ID.match(name) or "--" in name or ".." in name:
        raise InvalidParameter(
            "init_from", value, "a Hub model is written hf:NAMESPACE/NAME[@REVISION] (hf:FacebookAI/roberta-base)"
        )
    if "@" in value and not revision:
        raise InvalidParameter("init_from", value, "names no revision after '@' (a branch, tag or commit)")
    return name, revision or None


@contextlib.contextmanager
def base_model_files(init_from: str, patterns: tuple[str, ...], token: str = "") -> Iterator[Path]:
    """A local folder holding the files of ``init_from`` that match ``patterns`` (those it has), removed after."""
    with tempfile.TemporaryDirectory() as local:
        folder = Path(local)
        if init_from.startswith(HUB_MODEL_PREFIX):
            repo_id, revision = hub_name(init_from)
            download_repo("init_from", repo_id, folder, token, revision=revision, patterns=list(patterns))
        else:
            if not storage.exists(storage.join(init_from, CONFIG_FILE)):
                raise InvalidParameter("init_from", init_from, f"is not a model folder (no {CONFIG_FILE} in it)")
            for name in storage.listdir(init_from):
                name = name.rstrip("/")
                if any(fnmatch.fnmatch(name, pattern) for pattern in patterns):
                    (folder / name).write_bytes(storage.read_bytes(storage.join(init_from, name)))
        yield folder


def base_license(init_from: str, token: str = "") -> dict[str, str]:
    """The license its card's metadata gives the base model (``license``, and for ``other`` its ``license_name`` and
    ``license_link``): what a model continued from it is published under unless told otherwise; empty where the
    card states none (a folder saved by ``save_pretrained`` has no card)."""
    from huggingface_hub.repocard import metadata_load

    with base_model_files(init_from, (CARD_FILE,), token) as folder:
        metadata = (metadata_load(folder / CARD_FILE) if (folder / CARD_FILE).exists() else None) or {}
    terms = {
        key: value
        for key, valid in LICENSE_VALUES.items()
        if isinstance(value := metadata.get(key), str) and valid(value)
    }
    return terms if "license" in terms else {}  # none, or not a Hub license id (a list, free text)


def base_model_token(init_from: str, secret: str = "") -> str:
    """The Hub token ``init_from`` is read with (``hub.read_token``: ``secret``'s, else HF_TOKEN's); a folder: ""."""
    return read_token(secret) if init_from.startswith(HUB_MODEL_PREFIX) else ""


def pinned(init_from: str, token: str = "") -> str:
    """``init_from`` at the commit its revision names now (``hf:NAME@<commit id>``), which every later step reads: the
    weights a TPU job loads hours after the tokenizer step are the ones checked, whatever the branch does since. A
    folder as it is."""
    if not init_from.startswith(HUB_MODEL_PREFIX):
        return init_from
    from huggingface_hub import HfApi

    from components.lib.hub import with_retries

    repo_id, revision = hub_name(init_from)
    with refused_reads("init_from", init_from, repo_id, revision, token):
        info = with_retries(
            lambda: HfApi(token=token or None).model_info(repo_id, revision=revision), f"reading {repo_id}'s revision"
        )
    return f"{HUB_MODEL_PREFIX}{repo_id}@{info.sha}"


def model_name(init_from: str) -> str:
    """``init_from`` without its revision: what a run's parameters settle before the tokenizer step pins it."""
    return init_from.partition("@")[0] if init_from.startswith(HUB_MODEL_PREFIX) else init_from


def pinned_by_tokenizer(init_from: str, tokenizer_uri: str) -> str:
    """The commit the tokenizer step pinned ``init_from`` to (its summary in the tokenizer folder), for preflight and
    the train step; ``init_from`` as it is where the folder holds no such summary (a tokenizer folder of one's own)."""
    summary_uri = storage.join(tokenizer_uri, "tokenizer_summary.json")
    if not init_from.startswith(HUB_MODEL_PREFIX) or not storage.exists(summary_uri):
        return init_from
    summary = json.loads(storage.read_text(summary_uri))
    return summary.get("init_from_pinned", init_from) if summary.get("init_from") == init_from else init_from


def readable_without_token(init_from: str) -> bool:
    """Whether anyone may read the Hub model ``init_from`` (a TPU job has no Hub token); a folder: True."""
    if not init_from.startswith(HUB_MODEL_PREFIX):
        return True
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    repo_id, revision = hub_name(init_from)
    try:
        info = HfApi(token=False).model_info(repo_id, revision=revision)
    except (RepositoryNotFoundError, GatedRepoError):
        return False
    return not info.gated  # a gated model's card is public, its files are not


def check_base_model(init_from: str, max_length: int | None = None, token: str = "") -> BaseModel:
    """The base model's config and tokenizer, every check that needs no weights done: refused in one line naming
    ``init_from`` (or ``max_length``) when the model cannot be continued here."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_tf_auto import TF_MODEL_FOR_MASKED_LM_MAPPING_NAMES

    check_init_from(init_from)
    with base_model_files(init_from, (CONFIG_FILE, *TOKENIZER_PATTERNS), token) as folder:
        if not (folder / CONFIG_FILE).exists():
            raise InvalidParameter("init_from", init_from, f"holds no {CONFIG_FILE}: not a model")
        values = json.loads((folder / CONFIG_FILE).read_text())
        model_type = values.get("model_type")
        if model_type not in TF_MODEL_FOR_MASKED_LM_MAPPING_NAMES:
            raise InvalidParameter(
                "init_from", init_from, f"is a {model_type!r} model, which has no TensorFlow masked-LM model here"
            )
        if model_type not in BERT_LAYOUT:  # masked_lm runs the head it gets from get_lm_head, whole only for these
            raise InvalidParameter(
                "init_from",
                init_from,
                f"is a {model_type!r} model; the masked-LM loss here takes the head of {', '.join(BERT_LAYOUT)} models",
            )
        architectures = values.get("architectures") or []
        heads = MASKED_LM_HEADS if model_type == "bert" else MASKED_LM_HEADS[:1]  # BERT's pre-training head holds one
        if not any(name.endswith(heads) for name in architectures):
            raise InvalidParameter(
                "init_from",
                init_from,
                f"was saved as {', '.join(architectures) or 'a bare encoder'}, without a masked-LM head to continue",
            )
        config = AutoConfig.from_pretrained(folder)
        if not (folder / "tokenizer.json").exists():
            raise InvalidParameter("init_from", init_from, "has no fast tokenizer (tokenizer.json) beside the model")
        tokenizer = AutoTokenizer.from_pretrained(folder, use_fast=True)
    for role in ("mask_token", "pad_token"):
        if getattr(tokenizer, f"{role}_id") is None:
            raise InvalidParameter("init_from", init_from, f"its tokenizer has no {role}: no masked-LM training")
    if tokenizer.pad_token_id != config.pad_token_id:
        raise InvalidParameter(
            "init_from",
            init_from,
            f"its tokenizer pads with id {tokenizer.pad_token_id}, its config with {config.pad_token_id}",
        )
    if config.model_type in POSITIONS_AFTER_PAD and config.pad_token_id != 1:
        raise InvalidParameter(
            "init_from",
            init_from,
            f"pads with id {config.pad_token_id}; TensorFlow's {config.model_type} numbers positions from a padding "
            "id of 1",
        )
    if len(tokenizer) > config.vocab_size:
        raise InvalidParameter(
            "init_from",
            init_from,
            f"its tokenizer has {len(tokenizer):,} tokens, more than the model's {config.vocab_size:,} embeddings",
        )
    if max_length is not None:
        check_positions(init_from, config, max_length)
    weight_files(init_from, token)
    return BaseModel(init_from, config, tokenizer)


def positions_needed(config: Any, max_length: int) -> int:
    """The position embeddings a sample of ``max_length`` tokens takes in ``config``'s model."""
    offset = config.pad_token_id + 1 if config.model_type in POSITIONS_AFTER_PAD else 0
    return max_length + offset


def check_positions(init_from: str, config: Any, max_length: int) -> None:
    needed = positions_needed(config, max_length)
    if needed > config.max_position_embeddings:
        most = config.max_position_embeddings - (needed - max_length)
        raise InvalidParameter(
            "max_length", max_length, f"is more than {init_from} takes ({most} tokens: its position embeddings)"
        )


def weight_files(init_from: str, token: str = "") -> tuple[str, ...]:
    """The patterns of the weight files ``init_from`` is loaded from: TensorFlow's where it has them, else PyTorch's
    safetensors (one file, or shards and their index), read with numpy alone; refused when it has neither."""
    for patterns in WEIGHT_FILES:
        if init_from.startswith(HUB_MODEL_PREFIX):
            from huggingface_hub import HfApi

            repo_id, revision = hub_name(init_from)  # its revision and access were checked with its config
            found = HfApi(token=token or None).file_exists(repo_id, patterns[0], revision=revision)
        else:
            found = storage.exists(storage.join(init_from, patterns[0]))
        if found:
            return patterns
    raise InvalidParameter(
        "init_from",
        init_from,
        f"holds no weights read here ({TF_WEIGHTS_FILE}, or PyTorch's {WEIGHTS_FILE}); a pytorch_model.bin needs "
        "PyTorch to read: save the model with safetensors (save_pretrained's default) and give that",
    )


def load_base_weights(init_from: str, config: Any, token: str = "") -> Any:
    """The base model's TensorFlow masked-LM model with its weights, built with ``config`` (the base's, with the
    pre-training's dropout); called inside the strategy's scope, and by preflight on its CPU first. Refused when the
    weights lack any of the model's."""
    from transformers import TFAutoModelForMaskedLM

    from components.lib.pytorch_weights import TF_LOADING, read_pytorch_weights

    patterns = weight_files(init_from, token)
    with base_model_files(init_from, (CONFIG_FILE, *patterns), token) as folder:
        if patterns[0] == TF_WEIGHTS_FILE:
            model, loading = TFAutoModelForMaskedLM.from_pretrained(
                folder, config=config, output_loading_info=True, **TF_LOADING
            )
            missing = loading["missing_keys"]
        else:  # the pinned transformers cannot load PyTorch's safetensors into TF (huggingface/transformers#40318)
            model = TFAutoModelForMaskedLM.from_config(config)
            model(model.dummy_inputs, training=False)  # builds its weights
            missing = read_pytorch_weights(model, folder, "init_from", init_from)
    # transformers only logs weights it did not find, and starts them from random numbers: a head saved apart, or
    # another architecture's file, would train from scratch under the base's name
    if missing:
        raise InvalidParameter(
            "init_from",
            init_from,
            f"its {patterns[0]} lacks {len(missing)} of the masked-LM model's weights (the first: {missing[0]}): "
            "they would start from random numbers",
        )
    return model
