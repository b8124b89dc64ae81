"""Tokenize a corpus into fixed-length samples and write them as TFRecord shards.

Each text is tokenized as ``<s> ... </s>`` (blank texts are skipped), the token streams are concatenated
across texts and cut into samples of ``max_length`` tokens, so no text is lost: only the leftover shorter
than one sample at the very end of a part is dropped, once. Tokenization runs in batches on all cores (the
Rust tokenizer's threads) while the previous batch is written.

Shards are named ``<split>-<part>-<index>-<records>.tfrecord`` (the reference recipe's readers take the
record count from the name), written under a temporary name and renamed only when complete. Large corpora
fan out over machines with ``--num_parts N --part K``: part K reads only its share of the corpus (whole files,
byte ranges of big files, parquet row groups or a Hub dataset's file shards; see ``components.lib.corpus``), so
the N parts together read it once, and writes its own shards and ``parts/K-of-N.json``;
``python -m components.merge_shards`` then writes ``manifest.json``. A run with one part merges by itself.
``manifest.json`` is always written last: a folder without it is not done. Rerunning after a crash redoes
the unfinished part and yields one complete set.

    python -m components.shards --corpus embedded --tokenizer /tmp/tokenizer --output /tmp/shards/train
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from components.lib import storage
from components.lib.corpus import Corpus, CorpusSpec, holdout_texts
from components.lib.errors import InvalidParameter
from components.lib.job_runner import run_job
from components.lib.modeling import SampleLength
from components.lib.progress import Progress
from components.lib.records import serialize_examples, tfrecord_frame
from components.lib.shard_set import MANIFEST, dumps, manifest_for_people, merge_manifests, part_manifest_uri
from components.lib.tokenization import SPECIAL_TOKEN_ATTRIBUTES, load_tokenizer

log = logging.getLogger("tpu_mlm.shards")

HOLDOUT_CHOICES = ("exclude", "only")


@dataclass(kw_only=True)
class ShardArguments(SampleLength, CorpusSpec):
    output: str = field(metadata={"help": "Folder (local path or gs:// URI) for this split's shards."})
    tokenizer: str = field(metadata={"help": "Tokenizer folder made by components.tokenizer (local or gs://)."})
    split: str = field(default="train", metadata={"help": "Name of the split written (letters, digits, _)."})
    records_per_shard: int = field(default=10_000, metadata={"help": "Samples per TFRecord file."})
    num_parts: int = field(default=1, metadata={"help": "Number of parts the corpus is split into."})
    part: int = field(default=0, metadata={"help": "Which part this run writes (0 .. num_parts-1)."})
    holdout_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Fraction of texts held out (chosen by content hash), for a corpus "
            "without a validation split. 0 keeps every text."
        },
    )
    holdout: str = field(
        default="exclude",
        metadata={
            "help": "With --holdout_fraction: 'exclude' writes the texts not held "
            "out (train), 'only' writes just the held-out ones (validation).",
            "choices": HOLDOUT_CHOICES,
        },
    )
    batch_size: int = field(default=1_000, metadata={"help": "Texts tokenized per batch."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a complete shard set made with other settings."})

    def __post_init__(self) -> None:
        super().__post_init__()
        storage.check_uri("output", self.output)
        storage.check_uri("tokenizer", self.tokenizer)
        if not re.fullmatch(r"\w+", self.split):
            raise InvalidParameter("split", self.split, "must be letters, digits or _ (it is part of file names)")
        self.check_sample_length()
        _require_positive("records_per_shard", self.records_per_shard)
        _require_positive("batch_size", self.batch_size)
        if not 1 <= self.num_parts <= 99_999:
            raise InvalidParameter("num_parts", self.num_parts, "must be from 1 to 99999")
        if not 0 <= self.part < self.num_parts:
            raise InvalidParameter("part", self.part, f"must be from 0 to num_parts-1 = {self.num_parts - 1}")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise InvalidParameter("holdout_fraction", self.holdout_fraction, "must be at least 0 and below 1")
        if self.holdout not in HOLDOUT_CHOICES:
            raise InvalidParameter("holdout", self.holdout, f"must be one of {HOLDOUT_CHOICES}")
        if self.holdout == "only" and self.holdout_fraction == 0:
            raise InvalidParameter("holdout", self.holdout, "'only' needs a --holdout_fraction above 0")


def _require_positive(parameter: str, value: int) -> None:
    if value < 1:
        raise InvalidParameter(parameter, value, "must be a positive whole number")


def corpus_for_split(
    split: str, corpus: str, validation_corpus: str, holdout_fraction: float
) -> tuple[str, float, str]:
    """(corpus, holdout_fraction, holdout) for the train or validation shards of a pipeline run: the
    validation corpus when there is one, else a held-out fraction of the training corpus."""
    if validation_corpus:
        return (validation_corpus, 0.0, "exclude") if split == "validation" else (corpus, 0.0, "exclude")
    if holdout_fraction <= 0:
        raise InvalidParameter(
            "holdout_fraction", holdout_fraction, "must be above 0 when no validation corpus is given"
        )
    return corpus, holdout_fraction, "only" if split == "validation" else "exclude"


def write_shards(arguments: ShardArguments) -> dict[str, Any]:
    """Writes this part's shards and part manifest, then ``manifest.json`` when the run has one part.

    Returns the manifest (the part's, or the merged one). Input is checked before anything is written."""
    tokenizer, tokenizer_fingerprint = load_tokenizer(arguments.tokenizer)
    corpus = Corpus(arguments, arguments.num_parts, arguments.part)
    log.info("%s", corpus.describe_share())
    settings = _settings(arguments, tokenizer, tokenizer_fingerprint)
    part_uri = part_manifest_uri(arguments.output, arguments.part, arguments.num_parts)

    done = _completed(arguments, settings, part_uri)
    if done is not None:
        log.info("%s already holds this part with the same settings; nothing to do", arguments.output)
        if arguments.num_parts == 1 and not storage.exists(storage.join(arguments.output, MANIFEST)):
            return merge_manifests(arguments.output)  # stopped between the part manifest and the manifest
        return done
    _remove_leftovers(arguments, part_uri)

    started = time.perf_counter()
    texts = holdout_texts(iter(corpus), arguments.holdout_fraction, arguments.holdout)
    writer = ShardWriter(arguments.output, arguments.split, arguments.part, arguments.records_per_shard)
    progress = Progress(f"shards {arguments.split} part {arguments.part}", lambda: corpus.fraction_done)
    packer = SamplePacker(arguments.max_length, len(tokenizer))
    text_count = 0
    try:
        for batch_texts, ids in _tokenized_batches(tokenizer.backend_tokenizer, texts, arguments.batch_size):
            samples = packer.add(ids)
            writer.write(serialize_examples(samples))
            text_count += batch_texts
            progress.update(texts=batch_texts, tokens=len(ids), samples=len(samples))
        writer.close()
    except BaseException:  # a corpus file found bad (or any failure) halfway: no shard of this part is left
        writer.discard()
        raise
    if writer.total_records == 0 and arguments.num_parts == 1:
        raise InvalidParameter(
            "max_length",
            arguments.max_length,
            f"the corpus gave {packer.tokens_seen} tokens, less than one sample; use a larger corpus or a "
            "smaller --max_length",
        )
    seconds = time.perf_counter() - started
    part_manifest = {
        **settings,
        "part": arguments.part,
        "files": writer.files,
        "num_records": writer.total_records,
        "texts": text_count,
        "bytes_read": corpus.bytes_read,
        "text_bytes": corpus.reading.text_bytes,
        "non_utf8_bytes": corpus.reading.non_utf8_bytes,
        "tokens_written": writer.total_records * arguments.max_length,
        "tokens_dropped": packer.tokens_seen - writer.total_records * arguments.max_length,
        "token_counts": packer.token_counts.tolist(),
    }
    storage.write_text_atomic(part_uri, dumps(part_manifest))
    log.info(
        "part %d: %s bytes read (%s of text), %d texts, %d samples in %d files, %d tokens dropped, %.1f s "
        "(%.0f tokens/s)",
        arguments.part,
        f"{corpus.bytes_read:,}",
        f"{corpus.reading.text_bytes:,}",
        text_count,
        writer.total_records,
        len(writer.files),
        part_manifest["tokens_dropped"],
        seconds,
        packer.tokens_seen / max(seconds, 1e-9),
    )
    if arguments.num_parts == 1:
        return merge_manifests(arguments.output)
    return part_manifest


def _settings(arguments: ShardArguments, tokenizer: Any, tokenizer_fingerprint: str) -> dict[str, Any]:
    """What identifies a shard set: parts made with different settings cannot be merged or reused."""
    return {
        "format": "tfrecord/tf.train.Example",
        "features": {"input_ids": f"int64[{arguments.max_length}]", "attention_mask": f"int64[{arguments.max_length}]"},
        "split": arguments.split,
        "max_length": arguments.max_length,
        "records_per_shard": arguments.records_per_shard,
        "num_parts": arguments.num_parts,
        "holdout_fraction": arguments.holdout_fraction,
        "holdout": arguments.holdout if arguments.holdout_fraction else None,
        "corpus": arguments.describe(),
        "vocab_size": len(tokenizer),
        "special_tokens": {role: getattr(tokenizer, f"{role}_token_id") for role in SPECIAL_TOKEN_ATTRIBUTES},
        "tokenizer_fingerprint": tokenizer_fingerprint,
    }


def _completed(arguments: ShardArguments, settings: dict[str, Any], part_uri: str) -> dict[str, Any] | None:
    """The finished manifest when this work is already done with the same settings, None when it must be
    done. Raises when the output holds finished work made with other settings, unless overwriting."""
    manifest_uri = storage.join(arguments.output, MANIFEST)
    for uri in (manifest_uri, part_uri):
        if not storage.exists(uri):
            continue
        existing = json.loads(storage.read_text(uri))
        same = all(existing.get(key) == value for key, value in settings.items())
        if same and not arguments.overwrite:
            return existing
        if not arguments.overwrite:
            differing = sorted(key for key, value in settings.items() if existing.get(key) != value)
            raise InvalidParameter(
                "output",
                arguments.output,
                f"already holds finished shards made with other settings ({', '.join(differing)}); "
                "choose another folder or pass --overwrite",
            )
        storage.remove(uri)
    return None


def _remove_leftovers(arguments: ShardArguments, part_uri: str) -> None:
    """Deletes what an interrupted or overwritten run of this part left: its shards and temporary files."""
    prefix = storage.join(arguments.output, f"{arguments.split}-{arguments.part:05d}-")
    for uri in storage.glob(prefix + "*"):
        storage.remove(uri)
    storage.remove_temporaries(part_uri)


def _tokenized_batches(backend: Any, texts: Iterator[str], batch_size: int) -> Iterator[tuple[int, np.ndarray]]:
    """(number of texts, concatenated token ids) per batch. The next batch is tokenized in a thread (the
    tokenizer releases the GIL and uses every core) while this thread reads texts, converts the ids and the
    caller writes the current batch."""

    def batches() -> Iterator[list[str]]:
        batch: list[str] = []
        for text in texts:
            batch.append(text)
            if len(batch) == batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def concatenated_ids(encodings: list[Any]) -> tuple[int, np.ndarray]:
        ids = [encoding.ids for encoding in encodings]
        total = sum(map(len, ids))
        return len(ids), np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=total)

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for batch in batches():
            future = pool.submit(backend.encode_batch_fast, batch)
            if pending is not None:
                yield concatenated_ids(pending.result())
            pending = future
        if pending is not None:
            yield concatenated_ids(pending.result())


class SamplePacker:
    """Concatenates token ids across texts and cuts them into rows of ``max_length``; the remainder waits
    for the next batch, so at most one partial sample is left at the very end. Counts each token id written
    (the evaluation's unigram baseline)."""

    def __init__(self, max_length: int, vocab_size: int):
        self.max_length = max_length
        self.carry = np.empty(0, dtype=np.int64)
        self.tokens_seen = 0
        self.token_counts = np.zeros(vocab_size, dtype=np.int64)

    def add(self, ids: np.ndarray) -> np.ndarray:
        self.tokens_seen += len(ids)
        stream = np.concatenate([self.carry, ids])
        usable = len(stream) - len(stream) % self.max_length
        self.carry = stream[usable:]
        self.token_counts += np.bincount(stream[:usable], minlength=len(self.token_counts))
        return stream[:usable].reshape(-1, self.max_length)


class ShardWriter:
    """Writes records into ``<split>-<part>-<index>-<count>.tfrecord`` files of ``records_per_shard`` records,
    each under a temporary name until it is closed."""

    def __init__(self, output: str, split: str, part: int, records_per_shard: int):
        self.output, self.split, self.part = output, split, part
        self.records_per_shard = records_per_shard
        self.files: list[dict[str, Any]] = []
        self.total_records = 0
        self._writer: Any = None
        self._temp = ""
        self._in_file = 0

    def write(self, records: list[bytes]) -> None:
        for record in records:
            if self._writer is None:
                self._open()
            self._writer.write(tfrecord_frame(record))
            self._in_file += 1
            if self._in_file == self.records_per_shard:
                self._publish()

    def close(self) -> None:
        if self._writer is not None:
            self._publish()

    def discard(self) -> None:
        """Deletes what this writer wrote: a failed part leaves no shard that a ``*.tfrecord`` reader would take."""
        if self._writer is not None:
            self._writer.close()
            storage.remove(self._temp)
            self._writer = None
        for file in self.files:
            storage.remove(storage.join(self.output, file["name"]))
        self.files, self.total_records = [], 0

    def _open(self) -> None:
        index = len(self.files)
        if index == 0:
            storage.makedirs(self.output)  # not before the first record: a failed run leaves no folder
        self._temp = storage.join(self.output, f"{self.split}-{self.part:05d}-{index:05d}{storage.TEMP_SUFFIX}")
        self._writer = storage.open_file(self._temp, "wb")
        self._in_file = 0

    def _publish(self) -> None:
        self._writer.close()
        self._writer = None
        name = f"{self.split}-{self.part:05d}-{len(self.files):05d}-{self._in_file}.tfrecord"
        final = storage.join(self.output, name)
        storage.publish(self._temp, final)
        self.files.append({"name": name, "records": self._in_file, "bytes": storage.size(final)})
        self.total_records += self._in_file


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(ShardArguments, write_shards, argv, description=__doc__, for_people=manifest_for_people)


if __name__ == "__main__":
    sys.exit(main())
