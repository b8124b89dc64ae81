"""The tokenizer folder the steps hand on: loading it, checked, and its fingerprint."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter

# what the tokenizer trains on by default (see docs/benchmarks.md: the trainer's memory, measured)
DEFAULT_SAMPLE_BYTES = 2_000_000_000

# the tokenizer's special tokens by role, in the order it adds them first: their ids are their places here
SPECIAL_TOKEN_ROLES = {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask>"}
SPECIAL_TOKENS = tuple(SPECIAL_TOKEN_ROLES.values())
# the roles a tokenizer may name special tokens by (``<role>_token_id``): a trained tokenizer's, or a base model's
SPECIAL_TOKEN_ATTRIBUTES = ("bos", "eos", "pad", "mask", "unk", "cls", "sep")
TOKENIZER_FILE = "tokenizer.json"


def fingerprint(tokenizer_json: bytes) -> str:
    """Identifies a trained tokenizer: shards and models made with another one are refused."""
    return "sha256:" + hashlib.sha256(tokenizer_json).hexdigest()[:16]


def load_tokenizer(uri: str, parameter: str = "tokenizer") -> tuple[Any, str]:
    """Loads a tokenizer folder (local or gs://) and returns it with its fingerprint.

    Refuses, naming ``parameter``, a folder that is missing, has no fast-tokenizer file, or lacks the
    special tokens masked-language-model training needs (a mask and a pad token: a trained tokenizer's, or a base
    model's, ``components.lib.base_model``)."""
    from transformers import AutoTokenizer

    storage.check_uri(parameter, uri)
    if not storage.exists(storage.join(uri, TOKENIZER_FILE)):
        raise InvalidParameter(parameter, uri, f"is not a tokenizer folder (no {TOKENIZER_FILE} in it)")
    with tempfile.TemporaryDirectory() as local:
        storage.download_folder(uri, Path(local))
        # its own class (a base model's BertTokenizerFast, XLMRobertaTokenizerFast ...; the tokenizer step's
        # PreTrainedTokenizerFast), which the trained model's folder keeps
        tokenizer = AutoTokenizer.from_pretrained(local, use_fast=True)
        tokenizer_fingerprint = fingerprint(Path(local, TOKENIZER_FILE).read_bytes())
    for role in ("mask_token", "pad_token"):
        if getattr(tokenizer, role) is None or getattr(tokenizer, f"{role}_id") is None:
            raise InvalidParameter(
                parameter,
                uri,
                f"the tokenizer has no {role}; masked-language-model training needs a mask and a pad token "
                "(train one with components.tokenizer)",
            )
    return tokenizer, tokenizer_fingerprint
