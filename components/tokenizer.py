"""Train a Unigram tokenizer on a corpus and save it as a Hugging Face tokenizer folder.

The recipe follows Hugging Face's TF/TPU language-modeling example: a Unigram model, a normalizer that
turns LaTeX-style quotes (``, '') into ", a Metaspace pre-tokenizer and decoder. The special tokens are
RoBERTa's (<s>=0, <pad>=1, </s>=2, <unk>=3, <mask>=4) and a post-processor wraps each text as <s> ... </s>.
The folder loads with ``AutoTokenizer.from_pretrained``; ``tokenizer_summary.json`` beside it says what
was read and what came out, and is written last. With ``--init_from`` (continuing a model's pre-training) nothing is
trained: the folder is the base model's own tokenizer, as it is, checked (``components.lib.base_model``).

    python -m components.tokenizer --corpus embedded --vocab_size 8000 --output /tmp/tokenizer
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.base_model import (
    TOKENIZER_PATTERNS,
    BaseModelChoice,
    base_model_files,
    base_model_token,
    check_base_model,
    check_init_from,
    pinned,
)
from components.lib.corpus import Corpus, CorpusSpec
from components.lib.errors import InvalidParameter
from components.lib.job_runner import run_job
from components.lib.progress import Progress
from components.lib.tokenization import (
    DEFAULT_SAMPLE_BYTES,
    SPECIAL_TOKEN_ATTRIBUTES,
    SPECIAL_TOKEN_ROLES,
    SPECIAL_TOKENS,
    TOKENIZER_FILE,
    fingerprint,
)

log = logging.getLogger("tpu_mlm.tokenizer")

SUMMARY_FILE = "tokenizer_summary.json"
MAX_VOCAB_SIZE = 1_000_000


@dataclass(kw_only=True)
class TokenizerArguments(CorpusSpec, BaseModelChoice):
    output: str = field(metadata={"help": "Folder (local path or gs:// URI) to save the tokenizer in."})
    vocab_size: int = field(
        default=25_000,
        metadata={"help": "Target vocabulary size, special tokens included (with init_from: the base's own)."},
    )
    lowercase: bool = field(
        default=False,
        metadata={"help": "Lowercase all text before training (with init_from: as the base's tokenizer does)."},
    )
    sample_bytes: int = field(
        default=DEFAULT_SAMPLE_BYTES,
        metadata={
            "help": "Train on about this many bytes of text, spread evenly over the whole corpus and the same in "
            "every run (0: all of it). The Unigram trainer holds its input in memory: about 10 bytes a "
            "byte of sample at worst (measured in docs/benchmarks.md)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        storage.check_uri("output", self.output)
        check_init_from(self.init_from)
        if self.sample_bytes < 0:
            raise InvalidParameter("sample_bytes", self.sample_bytes, "must be 0 (the whole corpus) or positive")
        if not len(SPECIAL_TOKENS) < self.vocab_size <= MAX_VOCAB_SIZE:
            raise InvalidParameter(
                "vocab_size",
                self.vocab_size,
                f"must be larger than the {len(SPECIAL_TOKENS)} special tokens {list(SPECIAL_TOKENS)} "
                f"and at most {MAX_VOCAB_SIZE:,}",
            )


def build_tokenizer(lowercase: bool = False) -> Any:
    """An untrained Unigram tokenizer with the recipe's normalizer, pre-tokenizer and decoder."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        steps.append(normalizers.Lowercase())
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return tokenizer


def train_tokenizer(arguments: TokenizerArguments) -> dict[str, Any]:
    """Trains the tokenizer, saves it under ``arguments.output`` and returns the summary; with ``init_from``, saves
    the base model's tokenizer instead."""
    if arguments.init_from:
        return publish_base_tokenizer(arguments)
    from tokenizers import AddedToken, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = Corpus(arguments, sample_bytes=arguments.sample_bytes or None)
    started = time.perf_counter()
    counts = {"texts": 0, "bytes": 0}
    progress = Progress("tokenizer training read", lambda: corpus.fraction_done)

    def texts() -> Iterator[str]:
        for text in corpus:
            counts["texts"] += 1
            counts["bytes"] += len(text.encode("utf-8"))
            progress.update(texts=1)
            yield text

    tokenizer = build_tokenizer(arguments.lowercase)
    trainer = trainers.UnigramTrainer(
        vocab_size=arguments.vocab_size, special_tokens=list(SPECIAL_TOKENS), unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    bos, eos = (tokenizer.token_to_id(token) for token in ("<s>", "</s>"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    vocab_size = tokenizer.get_vocab_size()
    if vocab_size < arguments.vocab_size:
        log.warning(
            "the corpus reached a vocabulary of %d pieces, fewer than the %d asked for "
            "(a larger corpus gives more pieces)",
            vocab_size,
            arguments.vocab_size,
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=SPECIAL_TOKEN_ROLES["bos"],
        eos_token=SPECIAL_TOKEN_ROLES["eos"],
        unk_token=SPECIAL_TOKEN_ROLES["unk"],
        pad_token=SPECIAL_TOKEN_ROLES["pad"],
        # lstrip, as roberta-base's: "a <mask> of" masks the word with its boundary, "▁word" as training masked
        # it, instead of leaving a bare "▁" before the mask that training never showed the model
        mask_token=AddedToken(SPECIAL_TOKEN_ROLES["mask"], lstrip=True, special=True, normalized=False),
        cls_token=SPECIAL_TOKEN_ROLES["bos"],
        sep_token=SPECIAL_TOKEN_ROLES["eos"],
        model_max_length=512,
    )
    with tempfile.TemporaryDirectory() as staging:
        fast.save_pretrained(staging)
        summary = {
            "vocab_size": vocab_size,
            "vocab_size_requested": arguments.vocab_size,
            "special_tokens": {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS},
            "texts_read": counts["texts"],
            "bytes_read": counts["bytes"],
            "corpus_bytes_read": corpus.bytes_read,
            "text_bytes": corpus.reading.text_bytes,
            "non_utf8_bytes": corpus.reading.non_utf8_bytes,
            "sampled": corpus.sampled,
            "seconds": round(time.perf_counter() - started, 3),
            "fingerprint": fingerprint(Path(staging, TOKENIZER_FILE).read_bytes()),
            "arguments": asdict(arguments),
        }
        Path(staging, SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        storage.upload_folder(Path(staging), arguments.output, last=[SUMMARY_FILE])
    log.info(
        "trained on %d texts, %s bytes of text (%s), saved a tokenizer of %d pieces to %s",
        counts["texts"],
        f"{counts['bytes']:,}",
        "a sample spread over the corpus" if corpus.sampled else "the whole corpus",
        vocab_size,
        arguments.output,
    )
    return summary


def publish_base_tokenizer(arguments: TokenizerArguments) -> dict[str, Any]:
    """Saves the tokenizer files of the model ``init_from`` under ``arguments.output`` as they are, byte for byte
    (a ``tokenizer_config.json`` naming its class added where the model has none); returns the summary."""
    started = time.perf_counter()
    token = base_model_token(arguments.init_from, arguments.hf_token_secret)
    base = pinned(arguments.init_from, token)  # the commit every later step reads
    tokenizer = check_base_model(base, token=token).tokenizer
    with base_model_files(base, TOKENIZER_PATTERNS, token) as staging:
        if not (staging / "tokenizer_config.json").exists():  # roberta-base's: its class is in its config.json
            with tempfile.TemporaryDirectory() as saved:
                tokenizer.save_pretrained(saved)
                shutil.copy(Path(saved, "tokenizer_config.json"), staging)
        summary = {
            "vocab_size": len(tokenizer),
            "init_from": arguments.init_from,
            "init_from_pinned": base,
            "tokenizer_class": type(tokenizer).__name__,
            "special_tokens": {
                getattr(tokenizer, f"{role}_token"): getattr(tokenizer, f"{role}_token_id")
                for role in SPECIAL_TOKEN_ATTRIBUTES
                if getattr(tokenizer, f"{role}_token") is not None
            },
            "texts_read": 0,  # nothing trained: the base model's tokenizer
            "bytes_read": 0,
            "seconds": round(time.perf_counter() - started, 3),
            "fingerprint": fingerprint(Path(staging, TOKENIZER_FILE).read_bytes()),
            "arguments": asdict(arguments),
        }
        Path(staging, SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        storage.upload_folder(staging, arguments.output, last=[SUMMARY_FILE])
    log.info(
        "saved %s's tokenizer (%s, %d tokens) to %s, as it is: nothing trained",
        base,
        summary["tokenizer_class"],
        summary["vocab_size"],
        arguments.output,
    )
    return summary


def summary_for_people(summary: dict[str, Any]) -> str:
    if summary.get("init_from"):
        return f"{summary['init_from']}'s tokenizer of {summary['vocab_size']:,} tokens, as it is"
    read = "a sample spread over the corpus" if summary["sampled"] else "the whole corpus"
    return (
        f"a tokenizer of {summary['vocab_size']:,} pieces, trained on {summary['texts_read']:,} texts ({read}, "
        f"{summary['bytes_read']:,} bytes of text) in {summary['seconds']:,.0f} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(TokenizerArguments, train_tokenizer, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
