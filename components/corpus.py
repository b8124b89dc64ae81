"""One way to name a text corpus, accepted by every step.

``--corpus`` takes one of:

* ``embedded``: the English documentation text that CPython ships in ``pydoc_data`` (about 465 KB), so a
  first run needs no network and no data;
* ``hf:NAME[:CONFIG[:SPLIT]]``: a Hugging Face Hub dataset, streamed (``hf:wikitext:wikitext-103-raw-v1:train``);
* paths or globs, comma-separated, local or ``gs://``: ``.txt`` (one document per line), ``.jsonl`` and
  ``.parquet`` (with a text column).

Reading streams in bounded memory. Blank texts are skipped everywhere: they carry no text to learn from.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from components import storage
from components.errors import InvalidParameter

EMBEDDED = "embedded"
HUB_PREFIX = "hf:"
FILE_FORMATS = {".txt": "text", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class CorpusSpec:
    """Where the text comes from, which column holds it, and how many texts to read at most."""

    source: str
    text_column: str = "text"
    limit: int | None = None

    def __post_init__(self) -> None:
        if not self.source or not self.source.strip():
            raise InvalidParameter("corpus", self.source, f"name a corpus: {EXPECTED_FORMS}")
        if self.limit is not None and self.limit <= 0:
            raise InvalidParameter("limit", self.limit, "must be a positive number of texts, or unset")
        if not self.text_column:
            raise InvalidParameter("text_column", self.text_column, "must name the column holding the text")

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "text_column": self.text_column, "limit": self.limit}


EXPECTED_FORMS = (
    "'embedded', 'hf:NAME[:CONFIG[:SPLIT]]', or comma-separated local/gs:// paths or globs "
    f"of {', '.join(sorted(FILE_FORMATS))} files"
)


class Corpus:
    """An opened corpus: validated up front, then iterated as many times as needed.

    ``fraction_done`` follows the current iteration (bytes for files, rows where the total is known),
    for progress lines; it is ``None`` when the size is unknown.
    """

    def __init__(self, spec: CorpusSpec):
        self.spec = spec
        self.fraction_done: float | None = None
        source = spec.source.strip()
        if source == EMBEDDED:
            self.kind = "embedded"
        elif source.startswith(HUB_PREFIX):
            self.kind = "hub"
            self._hub_args = _parse_hub_name(source)
        else:
            self.kind = "files"
            self.files = _resolve_files(source)
            self.total_bytes = sum(size for _, _, size in self.files)
        self._check_first_text()

    def _check_first_text(self) -> None:
        """Reads the first text, so that a missing column or an empty corpus fails before any work."""
        if next(iter(self), None) is None:
            raise InvalidParameter("corpus", self.spec.source, "holds no text (every row is empty)")

    def __iter__(self) -> Iterator[str]:
        texts = (text for text in self._raw_texts() if text.strip())
        if self.spec.limit is not None:
            texts = itertools.islice(texts, self.spec.limit)
        return texts

    def _raw_texts(self) -> Iterator[str]:
        if self.kind == "embedded":
            return self._embedded_texts()
        if self.kind == "hub":
            return self._hub_texts()
        return self._file_texts()

    def _embedded_texts(self) -> Iterator[str]:
        lines = embedded_lines()
        for index, line in enumerate(lines):
            self.fraction_done = index / len(lines)
            yield line
        self.fraction_done = 1.0

    def _hub_texts(self) -> Iterator[str]:
        import datasets

        name, config, split = self._hub_args
        try:
            dataset = datasets.load_dataset(name, config, split=split, streaming=True)
        except Exception as error:  # the datasets library raises many types for a name it cannot load
            raise InvalidParameter("corpus", self.spec.source, f"cannot load the Hub dataset: {error}") from error
        split_info = (dataset.info.splits or {}).get(split)
        total = split_info.num_examples if split_info else None
        for index, row in enumerate(dataset):
            if self.spec.text_column not in row:
                raise _missing_column(self.spec, list(row), self.spec.source)
            if total:
                self.fraction_done = index / total
            yield row[self.spec.text_column]

    def _file_texts(self) -> Iterator[str]:
        done_bytes = 0
        for uri, file_format, file_size in self.files:
            reader = _parquet_texts if file_format == "parquet" else _line_texts
            for text, file_fraction in reader(uri, file_format, self.spec):
                self.fraction_done = (done_bytes + file_fraction * file_size) / max(self.total_bytes, 1)
                yield text
            done_bytes += file_size


def embedded_lines() -> list[str]:
    """The embedded corpus: the lines of CPython's ``pydoc_data`` topics, in a fixed order."""
    from pydoc_data.topics import topics

    return [line for key in sorted(topics) for line in topics[key].splitlines()]


def _parse_hub_name(source: str) -> tuple[str, str | None, str]:
    parts = source[len(HUB_PREFIX) :].split(":")
    if not parts[0] or len(parts) > 3 or any(not part for part in parts):
        raise InvalidParameter("corpus", source, "a Hub dataset is written hf:NAME[:CONFIG[:SPLIT]]")
    name, config, split = (*parts, None, None)[:3]
    return name, config, split or "train"


def _resolve_files(source: str) -> list[tuple[str, str, int]]:
    files: list[tuple[str, str, int]] = []
    for pattern in (p.strip() for p in source.split(",")):
        storage.check_uri("corpus", pattern)
        matches = storage.glob(pattern)
        if not matches:
            raise InvalidParameter("corpus", pattern, f"no file matches this path; expected {EXPECTED_FORMS}")
        for uri in matches:
            if storage.isdir(uri):
                raise InvalidParameter("corpus", uri, "is a folder; name its files, e.g. folder/*.txt")
            suffix = "." + uri.rsplit(".", 1)[-1].lower() if "." in storage.basename(uri) else ""
            if suffix not in FILE_FORMATS:
                raise InvalidParameter(
                    "corpus", uri, f"unknown file type {suffix or '(none)'}; supported: {sorted(FILE_FORMATS)}"
                )
            files.append((uri, FILE_FORMATS[suffix], storage.size(uri)))
    return files


def _missing_column(spec: CorpusSpec, columns: list[str], where: str) -> InvalidParameter:
    return InvalidParameter("text_column", spec.text_column, f"{where} has no such column; it has {columns}")


def _line_texts(uri: str, file_format: str, spec: CorpusSpec) -> Iterator[tuple[str, float]]:
    """Lines of a text or JSON-lines file with the fraction of the file read, decoded a 1 MiB block at a time."""
    file_size = max(storage.size(uri), 1)
    done = 0
    for block, block_bytes in _line_blocks(uri):
        done += block_bytes
        fraction = min(done / file_size, 1.0)
        for line in block:
            if file_format == "jsonl":
                line = _jsonl_text(line, spec, uri)
            yield line, fraction


def _line_blocks(uri: str) -> Iterator[tuple[list[str], int]]:
    """The file's lines, a block of whole lines at a time (splitting on "\\n", which never falls inside a
    UTF-8 character), with the number of bytes each block took."""
    with storage.open_file(uri, "rb") as f:
        tail = b""
        while chunk := f.read(_CHUNK_BYTES):
            buffer = tail + chunk
            cut = buffer.rfind(b"\n")
            if cut < 0:
                tail = buffer
                continue
            block, tail = buffer[:cut], buffer[cut + 1 :]
            yield _decode_lines(block), cut + 1
        if tail:
            yield _decode_lines(tail), len(tail)


def _decode_lines(block: bytes) -> list[str]:
    text = block.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if "\r" in text:  # Windows line ends
        lines = [line.removesuffix("\r") for line in lines]
    return lines


def _jsonl_text(line: str, spec: CorpusSpec, uri: str) -> str:
    if not line.strip():
        return ""
    row = json.loads(line)
    if not isinstance(row, dict) or spec.text_column not in row:
        raise _missing_column(spec, list(row) if isinstance(row, dict) else [], uri)
    return row[spec.text_column] or ""


def _parquet_texts(uri: str, _format: str, spec: CorpusSpec) -> Iterator[tuple[str, float]]:
    import pyarrow.parquet as pq

    with storage.open_random_access(uri) as f:
        parquet = pq.ParquetFile(f)
        if spec.text_column not in parquet.schema_arrow.names:
            raise _missing_column(spec, parquet.schema_arrow.names, uri)
        total = max(parquet.metadata.num_rows, 1)
        done = 0
        for batch in parquet.iter_batches(batch_size=1024, columns=[spec.text_column]):
            for text in batch.column(0).to_pylist():
                done += 1
                yield text or "", done / total


def select_texts(
    texts: Iterator[str], num_parts: int = 1, part: int = 0, holdout_fraction: float = 0.0, holdout: str = "exclude"
) -> Iterator[str]:
    """The texts of one part (text ``i`` belongs to part ``i mod num_parts``), without or with only the
    held-out ones. Held-out texts are chosen by a hash of their content, so the choice is the same in every
    run and every part, and the held-out and kept sets never share a text."""
    if num_parts == 1 and holdout_fraction == 0:
        yield from texts
        return
    for index, text in enumerate(texts):
        if index % num_parts != part:
            continue
        if holdout_fraction > 0 and is_held_out(text, holdout_fraction) != (holdout == "only"):
            continue
        yield text


def is_held_out(text: str, fraction: float) -> bool:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64
