"""One way to name a text corpus, accepted by every step, and which share of it a step reads.

``--corpus`` takes ``embedded``, ``hf:NAME[:CONFIG[:SPLIT]]``, or files (``spec.py``). Each source is a reader
of its own (``embedded.py``, ``hub_dataset.py``, ``file_set.py``: a file set's layout, its pieces read by
``line_files.py`` for text and JSON lines, plain or compressed, and ``parquet_files.py``) that gives its texts
for the whole corpus, a part (``Corpus(spec, num_parts=N, part=K)``: the N parts together read each text once,
in the corpus's order) and a sample (``Corpus(spec, sample_bytes=B)``: about B bytes spread over the whole
corpus, the same in every run; the tokenizer trains on one so that its memory stays bounded). ``Corpus`` keeps
what is the same for all of them: the checks on opening, blank texts skipped (they carry nothing to learn
from), the limit, the counts of what a pass read, and its progress.

Bytes that are not UTF-8 are replaced with U+FFFD and counted per file: a few give a warning, more than
``max_non_utf8_fraction`` of a file's bytes an error (a corpus in another encoding would otherwise be learnt
as replacement characters).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator

from components.lib.corpus.embedded import EmbeddedReader, embedded_lines
from components.lib.corpus.file_set import FilesReader
from components.lib.corpus.file_slice import LINE_STEP
from components.lib.corpus.hub_dataset import HubDatasetReader, parse_hub_name
from components.lib.corpus.reader import CorpusReader, Reading, Texts
from components.lib.corpus.spec import EMBEDDED, EXPECTED_FORMS, HUB_PREFIX, CorpusSpec
from components.lib.errors import InvalidParameter

__all__ = [
    "EMBEDDED",
    "EXPECTED_FORMS",
    "HUB_PREFIX",
    "LINE_STEP",
    "Corpus",
    "CorpusSpec",
    "embedded_lines",
    "holdout_texts",
    "is_held_out",
    "open_reader",
    "parse_hub_name",
]


def open_reader(spec: CorpusSpec) -> CorpusReader:
    """The reader of the corpus ``spec`` names, checked (names, files, formats) but not yet read."""
    source = spec.corpus.strip()
    if source == EMBEDDED:
        return EmbeddedReader(spec)
    if source.startswith(HUB_PREFIX):
        return HubDatasetReader(spec)
    return FilesReader(spec)


class Corpus:
    """An opened corpus: validated up front, then iterated as many times as needed.

    ``fraction_done`` follows the current iteration over this reader's share (bytes for files, rows where
    the total is known), for progress lines; ``None`` when the size is unknown. ``reading`` tells what the last
    iteration read: ``bytes_read`` from the files (compressed bytes for a compressed file; for ``hf:`` and
    ``embedded``, the text's UTF-8 bytes), ``text_bytes`` of text they gave, ``non_utf8_bytes`` replaced.
    """

    def __init__(self, spec: CorpusSpec, num_parts: int = 1, part: int = 0, sample_bytes: int | None = None):
        if sample_bytes and num_parts > 1:
            raise ValueError("a corpus is read as a sample or as parts, not both")
        self.spec = spec
        self.num_parts, self.part = num_parts, part
        self.reader = open_reader(spec)
        self.sampled = bool(sample_bytes) and self.reader.takes_sample(sample_bytes)
        self.sample_bytes = sample_bytes if self.sampled else None
        self.fraction_done: float | None = None
        self.reading = Reading(spec.max_non_utf8_fraction)
        self._share(self.reading).close()  # planning the share checks it (a compressed file is not cut into parts)
        self._check_first_text()

    def _share(self, reading: Reading) -> Texts:
        if self.sample_bytes:
            return self.reader.sample(self.sample_bytes, reading)
        if self.num_parts > 1:
            return self.reader.part(self.num_parts, self.part, reading)
        return self.reader.whole(reading)

    def _check_first_text(self) -> None:
        """Reads the corpus's first text, so that a missing column or an empty corpus fails before any work,
        whatever share this reader has."""
        texts = self.reader.whole(Reading(self.spec.max_non_utf8_fraction))
        try:
            first = next((text for text, _ in texts if text.strip()), None)
        finally:
            texts.close()  # a Hub dataset's stream holds connections and reader threads
        if first is None:
            raise InvalidParameter("corpus", self.spec.corpus, "holds no text (every row is empty)")

    def describe_share(self) -> str:
        if self.sample_bytes:
            return f"a sample of {self.sample_bytes:,} bytes spread over the corpus"
        return self.reader.describe_part(self.num_parts, self.part)

    @property
    def bytes_read(self) -> int:
        return self.reading.bytes_read

    def __iter__(self) -> Iterator[str]:
        self.reading = Reading(self.spec.max_non_utf8_fraction)
        texts = (text for text in self._follow(self._share(self.reading)) if text.strip())
        if self.spec.limit:
            texts = itertools.islice(texts, self.spec.limit)
        return texts

    def _follow(self, texts: Texts) -> Iterator[str]:
        for text, done in texts:
            self.fraction_done = done
            yield text
        self.fraction_done = 1.0


def holdout_texts(texts: Iterator[str], holdout_fraction: float = 0.0, holdout: str = "exclude") -> Iterator[str]:
    """The texts without, or with only, the held-out ones. Held-out texts are chosen by a hash of their
    content, so the choice is the same in every run and every part, and the held-out and kept sets never
    share a text."""
    if holdout_fraction == 0:
        yield from texts
        return
    for text in texts:
        if is_held_out(text, holdout_fraction) == (holdout == "only"):
            yield text


def is_held_out(text: str, fraction: float) -> bool:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64
