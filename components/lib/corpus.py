"""One way to name a text corpus, accepted by every step, and which share of it a step reads.

``--corpus`` takes one of:

* ``embedded``: the English documentation text that CPython ships in ``pydoc_data`` (about 465 KB), so a
  first run needs no network and no data;
* ``hf:NAME[:CONFIG[:SPLIT]]``: a Hugging Face Hub dataset, streamed (``hf:wikitext:wikitext-103-raw-v1:train``);
* paths or globs, comma-separated, local or ``gs://``: ``.txt`` (one document per line), ``.jsonl`` and
  ``.parquet`` (with a text column); text and JSON lines also compressed (``.txt.gz``, ``.jsonl.zst``,
  ``.json.bz2``, ``.txt.xz``, ...), decompressed as they stream.

Reading streams in bounded memory. Blank texts are skipped everywhere: they carry no text to learn from.
Bytes that are not UTF-8 are replaced with U+FFFD and counted per file: a few give a warning, more than
``max_non_utf8_fraction`` of a file's bytes an error (a corpus in another encoding would otherwise be learnt
as replacement characters).

**Parts.** ``Corpus(spec, num_parts=N, part=K)`` reads only part K's share, and the N parts together read
each byte once, in the corpus's order (part 0's texts, then part 1's, ...):

* files: the files laid end to end are cut into N equal byte ranges. With at least N files, each file goes
  whole to the part holding its middle byte (whole files, balanced by size, in order). With fewer, text and
  JSON-lines files are read by byte range: a part starts at the first line that starts inside its range and
  ends with the line that crosses its end; parquet files by row group (the part holding its middle byte).
  A compressed file cannot be cut by byte range: a corpus with one needs at least N files;
* ``hf:`` datasets: the dataset's own file shards (``IterableDataset.shard``), split further into parquet
  row groups (``reshard``) when there are fewer files than parts, else every N-th example (logged: each
  part then streams the whole dataset);
* ``embedded``: contiguous runs of lines.

**Samples.** ``Corpus(spec, sample_bytes=B)`` reads about B bytes spread over the whole corpus, the same in
every run: windows of the files evenly spaced from start to end (lines cut as for parts), or the head of
each of a Hub dataset's shards. The tokenizer trains on a sample so that its memory stays bounded. The text
of a compressed file has no offsets to seek to: its windows start where its compressed bytes reach their
place and take their width in text, and the file is decompressed in one pass up to its last window.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.hub import secret_token

log = logging.getLogger("tpu_mlm.corpus")

EMBEDDED = "embedded"
HUB_PREFIX = "hf:"
FILE_FORMATS = {".txt": "text", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_CHUNK_BYTES = 1 << 20
LINE_STEP = 4096  # past the end of its range, a reader finishes its last line in reads of this size
_SAMPLE_WINDOWS = 1024  # a sample is read as at most this many windows ...
_MIN_WINDOW = 1 << 16  # ... of at least this many bytes
_UTF8_CHECK_BYTES = 1 << 16  # a file's share of bytes that are not UTF-8 is judged once this much is read
_ESCAPED_BYTES = re.compile("[\udc80-\udcff]")  # what "surrogateescape" makes of a byte that is not UTF-8


@dataclass(frozen=True)
class CorpusSpec:
    """Where the text comes from, which column holds it, and how many texts to read at most."""

    source: str
    text_column: str = "text"
    limit: int | None = None
    hf_token_secret: str = ""  # Secret Manager secret with a Hub token, for private hf: datasets; else HF_TOKEN
    max_non_utf8_fraction: float = 0.001

    def __post_init__(self) -> None:
        if not self.source or not self.source.strip():
            raise InvalidParameter("corpus", self.source, f"name a corpus: {EXPECTED_FORMS}")
        if self.limit is not None and self.limit <= 0:
            raise InvalidParameter("limit", self.limit, "must be a positive number of texts, or unset")
        if not self.text_column:
            raise InvalidParameter("text_column", self.text_column, "must name the column holding the text")
        if not 0 <= self.max_non_utf8_fraction <= 1:
            raise InvalidParameter(
                "max_non_utf8_fraction", self.max_non_utf8_fraction, "must be a share of a file's bytes, 0 to 1"
            )

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "text_column": self.text_column, "limit": self.limit}


@dataclass(kw_only=True)
class CorpusArguments:
    """The corpus a step reads, as the tokenizer and shards steps (and the pipeline) take it."""

    corpus: str = field(
        default=EMBEDDED,
        metadata={
            "help": "'embedded', 'hf:NAME[:CONFIG[:SPLIT]]', or comma-separated .txt/.jsonl/.parquet paths or "
            "globs (local or gs://); .txt and .jsonl also as .gz, .zst, .bz2 or .xz."
        },
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the text (Hub, JSON lines, Parquet)."})
    limit: int = field(
        default=0,
        metadata={"help": "Read at most this many texts; 0: all. With parts, per part: N parts read up to N x limit."},
    )
    hf_token_secret: str = field(
        default="",
        metadata={"help": "Secret Manager secret holding a Hub token (private hf: datasets, the push); else HF_TOKEN."},
    )
    max_non_utf8_fraction: float = field(
        default=0.001,
        metadata={
            "help": "Refuse a corpus file when more than this share of its bytes are not UTF-8; fewer are replaced "
            "with U+FFFD and counted (a warning, and non_utf8_bytes in the manifest)."
        },
    )

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise InvalidParameter("limit", self.limit, "must be a positive number of texts, or 0 for all")
        self.corpus_spec  # noqa: B018  (its checks: a corpus named, a text column)

    @property
    def corpus_spec(self) -> CorpusSpec:
        return CorpusSpec(
            self.corpus, self.text_column, self.limit or None, self.hf_token_secret, self.max_non_utf8_fraction
        )


EXPECTED_FORMS = (
    "'embedded', 'hf:NAME[:CONFIG[:SPLIT]]', or comma-separated local/gs:// paths or globs "
    f"of {', '.join(sorted(FILE_FORMATS))} files (all but .parquet also {'/'.join(storage.DECOMPRESSORS)})"
)


@dataclass(frozen=True)
class FileSlice:
    """What a reader takes of one file: for text formats the lines that start in ``[start, end)``, for
    parquet the row groups whose middle byte lies there (byte offsets spread over the row groups by size)."""

    uri: str
    file_format: str
    size: int
    start: int
    end: int
    text_window: bool = False  # a sample's window of a compressed file: from the compressed offset ``start``,
    # the lines of ``end - start`` bytes of text

    @property
    def compressed(self) -> bool:
        return bool(storage.compression(self.uri))

    @property
    def width(self) -> int:
        return self.end - self.start


class Reading:
    """What one pass over a corpus read: bytes from storage, the bytes of text they gave, and per file the bytes
    that are not UTF-8 (each replaced with U+FFFD), held against ``max_non_utf8_fraction``."""

    def __init__(self, max_non_utf8_fraction: float):
        self.limit = max_non_utf8_fraction
        self.bytes_read = 0
        self.text_bytes = 0
        self.non_utf8: dict[str, list[int]] = {}  # uri -> [bytes not UTF-8, bytes decoded]

    @property
    def non_utf8_bytes(self) -> int:
        return sum(bad for bad, _ in self.non_utf8.values())

    def read(self, count: int) -> None:
        self.bytes_read += count

    def read_text(self, count: int) -> None:
        """Bytes read that are text already (the embedded corpus, a Hub dataset's rows)."""
        self.bytes_read += count
        self.text_bytes += count

    def decode_lines(self, block: bytes, uri: str) -> list[str]:
        """The lines of ``block`` (whole lines of ``uri`` joined by "\\n")."""
        if uri not in self.non_utf8:  # the file's first block: its byte-order mark, if any
            if block.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise InvalidParameter(
                    "corpus",
                    uri,
                    "is UTF-16 (its byte-order mark says so): re-encode it as UTF-8 (iconv -f UTF-16 -t UTF-8)",
                )
            block = block.removeprefix(b"\xef\xbb\xbf")  # UTF-8's, which editors on Windows write
        counts = self.non_utf8.setdefault(uri, [0, 0])
        counts[1] += len(block) + 1
        self.text_bytes += len(block) + 1
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError:
            text = block.decode("utf-8", errors="surrogateescape")
            counts[0] += len(_ESCAPED_BYTES.findall(text))
            text = _ESCAPED_BYTES.sub("\ufffd", text)
            if counts[1] >= _UTF8_CHECK_BYTES:
                self._check(uri)
        lines = text.split("\n")
        if "\r" in text:  # Windows line ends
            lines = [line.removesuffix("\r") for line in lines]
        return lines

    def finish_file(self, uri: str) -> None:
        """Judges a file once this pass is done with it: an error above the limit, else a warning for any."""
        self._check(uri)
        bad, decoded = self.non_utf8.get(uri, (0, 0))
        if bad:
            log.warning(
                "%s: %s byte(s) that are not UTF-8 replaced with U+FFFD (%.4f%% of %s bytes read)",
                uri,
                f"{bad:,}",
                100 * bad / decoded,
                f"{decoded:,}",
            )

    def _check(self, uri: str) -> None:
        bad, decoded = self.non_utf8.get(uri, (0, 0))
        if bad and bad > self.limit * decoded:
            raise InvalidParameter(
                "corpus",
                uri,
                f"{bad / decoded:.2%} of its bytes are not UTF-8 ({bad:,} of {decoded:,} read), more than "
                f"max_non_utf8_fraction={self.limit}: re-encode it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8) or "
                "raise max_non_utf8_fraction to read it with those bytes replaced",
            )


class Corpus:
    """An opened corpus: validated up front, then iterated as many times as needed.

    ``fraction_done`` follows the current iteration over this reader's share (bytes for files, rows where
    the total is known), for progress lines; ``None`` when the size is unknown. ``reading`` tells what the last
    iteration read: ``bytes_read`` from the files (compressed bytes for a compressed file; for ``hf:`` and
    ``embedded``, the text's UTF-8 bytes), ``text_bytes`` of text they gave, ``non_utf8_bytes`` replaced.
    """

    def __init__(self, spec: CorpusSpec, num_parts: int = 1, part: int = 0, sample_bytes: int | None = None):
        self.spec = spec
        self.num_parts, self.part, self.sample_bytes = num_parts, part, sample_bytes
        self.fraction_done: float | None = None
        self.reading = Reading(spec.max_non_utf8_fraction)
        source = spec.source.strip()
        if source == EMBEDDED:
            self.kind = "embedded"
            self.total_bytes = sum(len(line.encode("utf-8")) + 1 for line in embedded_lines())
        elif source.startswith(HUB_PREFIX):
            self.kind = "hub"
            self._hub_args = parse_hub_name(source)
        else:
            self.kind = "files"
            self.files = _resolve_files(source)
            self.total_bytes = sum(size for _, _, size in self.files)
        if self.kind == "files":
            self.slices = self._plan_slices()
        self._check_first_text()

    def _check_first_text(self) -> None:
        """Reads the corpus's first text, so that a missing column or an empty corpus fails before any work,
        whatever share this reader has."""
        texts = self._raw_texts(whole=True)
        try:
            first = next((text for text in texts if text.strip()), None)
        finally:
            texts.close()  # a Hub dataset's stream holds connections and reader threads
        if first is None:
            raise InvalidParameter("corpus", self.spec.source, "holds no text (every row is empty)")

    @property
    def sampled(self) -> bool:
        """Whether this reader reads a sample rather than all of its share."""
        if self.kind == "hub":  # its size is not known before reading
            return bool(self.sample_bytes)
        if self.kind == "files" and any(storage.compression(uri) for uri, _, _ in self.files):
            return bool(self.sample_bytes)  # its size in text is not known before reading
        return bool(self.sample_bytes) and self.sample_bytes < self.total_bytes

    def estimated_text_bytes(self, probes: int = 8) -> tuple[int, float]:
        """The corpus's bytes of text, and the bytes of text per compressed byte they assume: measured on the
        first MiB of up to ``probes`` compressed files spread over the corpus, weighted by their sizes."""
        if self.kind != "files":
            return self.total_bytes, 1.0
        compressed = [(uri, size) for uri, _, size in self.files if storage.compression(uri)]
        if not compressed:
            return self.total_bytes, 1.0
        probed = compressed[:: max(1, math.ceil(len(compressed) / probes))]
        expansion = sum(_expansion(uri) * size for uri, size in probed) / max(sum(size for _, size in probed), 1)
        plain = self.total_bytes - sum(size for _, size in compressed)
        return plain + int(expansion * sum(size for _, size in compressed)), expansion

    def describe_share(self) -> str:
        planned = sum(piece.width for piece in self.slices)
        what = f"a sample of {self.sample_bytes:,} bytes" if self.sample_bytes else f"part {self.part}"
        return (
            f"{what}: {planned:,} of the corpus's {self.total_bytes:,} bytes, "
            f"in {len(self.slices)} piece(s) of {len({piece.uri for piece in self.slices})} file(s)"
        )

    @property
    def bytes_read(self) -> int:
        return self.reading.bytes_read

    def __iter__(self) -> Iterator[str]:
        self.reading = Reading(self.spec.max_non_utf8_fraction)
        texts = (text for text in self._raw_texts() if text.strip())
        if self.spec.limit is not None:
            texts = itertools.islice(texts, self.spec.limit)
        return texts

    def _raw_texts(self, whole: bool = False) -> Iterator[str]:
        """This reader's share of the texts, or with ``whole`` all of them."""
        if self.kind == "embedded":
            return self._embedded_texts(whole)
        if self.kind == "hub":
            return self._hub_texts(whole)
        return self._file_texts(self._whole_files() if whole else self.slices)

    def _whole_files(self) -> list[FileSlice]:
        return [FileSlice(uri, fmt, size, 0, size) for uri, fmt, size in self.files]

    # -- which share -----------------------------------------------------------------------------------------

    def _plan_slices(self) -> list[FileSlice]:
        total = self.total_bytes
        if self.sampled:
            return self._sample_slices()
        if self.num_parts == 1:
            return self._whole_files()
        bounds = [int(k * total / self.num_parts) for k in range(self.num_parts + 1)]
        compressed = [uri for uri, _, _ in self.files if storage.compression(uri)]
        if compressed and len(self.files) < self.num_parts:
            raise InvalidParameter(
                "num_parts",
                self.num_parts,
                f"the corpus has {len(self.files)} file(s), {len(compressed)} of them compressed, and a compressed "
                f"file cannot be cut into parts: use num_parts <= {len(self.files)}, or a corpus of at least "
                f"{self.num_parts} files",
            )
        if len(self.files) >= self.num_parts:  # whole files, each to the part that holds its middle byte
            slices, offset = [], 0
            for uri, fmt, size in self.files:
                if _part_of(offset + size / 2, total, self.num_parts) == self.part:
                    slices.append(FileSlice(uri, fmt, size, 0, size))
                offset += size
            return slices
        return _file_slices(self.files, [(bounds[self.part], bounds[self.part + 1])])

    def _sample_slices(self) -> list[FileSlice]:
        """A sample's windows, spread evenly over the corpus's stored bytes. A window in a compressed file starts
        at its compressed offset and takes its width in bytes of text (the text's size is not known). A window
        is split where a file ends, except at the end of the corpus when its last file is compressed: that file's
        text outlasts its bytes, and a last window cut at its bytes would leave the sample short (a small file,
        whose sample is larger than its compressed bytes, lost a third of it)."""
        files = list(self.files)
        if storage.compression(files[-1][0]):
            files[-1] = (*files[-1][:2], sys.maxsize)
        sizes = {uri: size for uri, _, size in self.files}
        windows = _file_slices(files, _sample_windows(self.sample_bytes, self.total_bytes))
        return [
            replace(piece, size=sizes[piece.uri], text_window=True) if piece.compressed else piece for piece in windows
        ]

    # -- readers -----------------------------------------------------------------------------------------------

    def _embedded_texts(self, whole: bool) -> Iterator[str]:
        lines = embedded_lines()
        count = len(lines)
        if whole:
            chosen = list(range(count))
        elif self.sampled:
            share = self.sample_bytes / self.total_bytes
            chosen = [i for i in range(count) if math.floor((i + 1) * share) > math.floor(i * share)]
        else:
            chosen = list(range(count * self.part // self.num_parts, count * (self.part + 1) // self.num_parts))
        for done, index in enumerate(chosen):
            self.fraction_done = done / max(len(chosen), 1)
            self.reading.read_text(len(lines[index].encode("utf-8")) + 1)
            yield lines[index]
        self.fraction_done = 1.0

    def _hub_texts(self, whole: bool) -> Iterator[str]:
        dataset = self._hub_dataset()
        split_info = (dataset.info.splits or {}).get(self._hub_args[2])
        total = split_info.num_examples if split_info else None
        if whole or (self.num_parts == 1 and not self.sample_bytes):
            rows: Any = iter(dataset)
        elif self.sample_bytes:
            rows, total = self._hub_sample(dataset.reshard()), None
        else:
            rows, total = self._hub_part(dataset), None
        try:
            for index, row in enumerate(rows):
                text = row[self.spec.text_column] or ""
                if total:
                    self.fraction_done = index / total
                self.reading.read_text(len(text.encode("utf-8")))
                yield text
        finally:
            rows.close()

    def _hub_dataset(self) -> Any:
        import datasets

        name, config, split = self._hub_args
        token = secret_token(self.spec.hf_token_secret) if self.spec.hf_token_secret else None  # else HF_TOKEN
        try:
            dataset = datasets.load_dataset(name, config, split=split, streaming=True, token=token)
        except Exception as error:  # the datasets library raises many types for a name it cannot load
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise InvalidParameter("corpus", self.spec.source, f"cannot load the Hub dataset: {reason}") from error
        if dataset.features is not None and self.spec.text_column not in dataset.features:
            raise _missing_column(self.spec, list(dataset.features), self.spec.source)
        return dataset

    def _hub_part(self, dataset: Any) -> Iterator[dict[str, Any]]:
        """This part's share of the dataset's file shards, or of its parquet row groups when there are fewer
        files than parts; else every N-th example."""
        if dataset.num_shards < self.num_parts:
            dataset = dataset.reshard()
        if dataset.num_shards >= self.num_parts:
            log.info(
                "part %d of %d reads its share of %d dataset shards", self.part, self.num_parts, dataset.num_shards
            )
            yield from dataset.shard(self.num_parts, self.part)
            return
        log.warning(
            "the dataset has %d shard(s), fewer than the %d parts: each part streams the whole dataset and keeps "
            "every %d-th example",
            dataset.num_shards,
            self.num_parts,
            self.num_parts,
        )
        yield from itertools.islice(dataset, self.part, None, self.num_parts)

    def _hub_sample(self, dataset: Any) -> Iterator[dict[str, Any]]:
        """The head of every shard (row group) of the dataset, an equal share of ``sample_bytes`` each."""
        shards = dataset.num_shards
        budget = self.sample_bytes / shards
        for index in range(shards):
            used = 0
            for row in dataset.shard(shards, index):
                yield row
                used += len(str(row.get(self.spec.text_column) or "").encode("utf-8"))
                if used >= budget:
                    break

    def _file_texts(self, slices: list[FileSlice]) -> Iterator[str]:
        """The texts of the pieces, a file at a time (its pieces are next to each other)."""
        planned = max(sum(piece.width for piece in slices), 1)
        done = 0
        for uri, group in itertools.groupby(slices, key=lambda piece: piece.uri):
            pieces = list(group)
            if pieces[0].compressed:  # one pass over the file, whatever its pieces
                readers = [(_compressed_line_texts(pieces, self.spec, self.reading), pieces)]
            else:
                reader = _parquet_texts if pieces[0].file_format == "parquet" else _line_texts
                readers = [(reader(piece, self.spec, self.reading), [piece]) for piece in pieces]
            for texts, covered in readers:  # each tells how many bytes of its pieces it has done
                for text, reader_done in texts:
                    self.fraction_done = min((done + reader_done) / planned, 1.0)
                    yield text
                done += sum(piece.width for piece in covered)
            self.reading.finish_file(uri)
        self.fraction_done = 1.0


def _sample_windows(sample_bytes: int, total: int) -> list[tuple[int, int]]:
    """Byte ranges of about ``sample_bytes`` in all, evenly spaced over ``total`` bytes."""
    windows = max(1, min(_SAMPLE_WINDOWS, sample_bytes // _MIN_WINDOW))
    width = sample_bytes / windows
    return [(int(i * total / windows), int(i * total / windows + width)) for i in range(windows)]


def _expansion(uri: str) -> float:
    """Bytes of text per compressed byte in the first MiB of a compressed file."""
    text = 0
    try:
        with storage.DecompressedFile(uri) as f:
            while f.compressed_bytes_read < _CHUNK_BYTES and (chunk := f.read(_CHUNK_BYTES)):
                text += len(chunk)
            return text / max(f.compressed_bytes_read, 1)
    except storage.DECOMPRESSION_ERRORS as error:
        raise _undecompressable(uri, error) from None


def _part_of(offset: float, total: int, num_parts: int) -> int:
    return min(num_parts - 1, int(offset * num_parts / max(total, 1)))


def _file_slices(files: list[tuple[str, str, int]], ranges: list[tuple[int, int]]) -> list[FileSlice]:
    """The pieces of ``files`` (laid end to end) that fall in the global byte ``ranges``."""
    slices, offset = [], 0
    for uri, fmt, size in files:
        for low, high in ranges:
            start, end = max(low - offset, 0), min(high - offset, size)
            if start < end:
                slices.append(FileSlice(uri, fmt, size, start, end))
        offset += size
    return slices


def embedded_lines() -> list[str]:
    """The embedded corpus: the lines of CPython's ``pydoc_data`` topics, in a fixed order."""
    from pydoc_data.topics import topics

    return [line for key in sorted(topics) for line in topics[key].splitlines()]


def parse_hub_name(source: str) -> tuple[str, str | None, str]:
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
            compression = storage.compression(uri)
            suffix = storage.suffix(storage.basename(uri)[: len(storage.basename(uri)) - len(compression)])
            if suffix not in FILE_FORMATS:
                raise InvalidParameter(
                    "corpus", uri, f"unknown file type {suffix + compression or '(none)'}; expected {EXPECTED_FORMS}"
                )
            if compression and FILE_FORMATS[suffix] == "parquet":
                raise InvalidParameter(
                    "corpus", uri, "a parquet file is compressed inside (its codec); name the .parquet file itself"
                )
            files.append((uri, FILE_FORMATS[suffix], storage.size(uri)))
    return files


def _missing_column(spec: CorpusSpec, columns: list[str], where: str) -> InvalidParameter:
    return InvalidParameter("text_column", spec.text_column, f"{where} has no such column; it has {columns}")


def _line_texts(piece: FileSlice, spec: CorpusSpec, reading: Reading) -> Iterator[tuple[str, int]]:
    """(text, bytes of the piece done) for the lines of a text or JSON-lines piece, decoded a 1 MiB block at a
    time; ``reading`` counts the bytes read from storage and decodes."""
    done = 0
    for block, block_bytes in _line_blocks(piece.uri, piece.start, piece.end, reading.read):
        done = min(done + block_bytes, piece.end - piece.start)
        for line in reading.decode_lines(block, piece.uri):
            yield (_jsonl_text(line, spec, piece.uri) if piece.file_format == "jsonl" else line), done


def _line_blocks(uri: str, start: int, end: int, count_read: Any) -> Iterator[tuple[bytes, int]]:
    """The lines of the file that start in ``[start, end)``, a block of whole lines at a time (joined by "\\n",
    which never falls inside a UTF-8 character), with the bytes of the range each block covers. A line that
    starts before ``start`` belongs to the range before; the line that crosses ``end`` is read whole."""
    with storage.open_file(uri, "rb") as f:
        position = max(start - 1, 0)  # file offset of buffer[0]
        if position:
            f.seek(position)
        buffer, skipping = b"", start > 0
        while skipping or position < end:
            reached = position + len(buffer)  # file offset of the next read
            chunk = f.read(min(_CHUNK_BYTES, end - reached) if reached < end else LINE_STEP)
            count_read(len(chunk))
            buffer += chunk
            if skipping:  # drop the end of the line that started before this range
                cut = buffer.find(b"\n")
                if cut < 0:
                    position, buffer = position + len(buffer), b""
                    if not chunk:
                        return
                    continue
                position, buffer, skipping = position + cut + 1, buffer[cut + 1 :], False
            if position >= end:
                return
            if position + len(buffer) > end or not chunk:
                stop = buffer.find(b"\n", end - 1 - position)  # the newline ending the line that crosses `end`
                if stop >= 0 or not chunk:
                    if buffer:
                        yield (buffer if stop < 0 else buffer[:stop]), end - position
                    return
                continue  # that line goes on past this read
            cut = buffer.rfind(b"\n")
            if cut >= 0:
                yield buffer[:cut], cut + 1
                position, buffer = position + cut + 1, buffer[cut + 1 :]


def _compressed_line_texts(pieces: list[FileSlice], spec: CorpusSpec, reading: Reading) -> Iterator[tuple[str, int]]:
    """(text, bytes of the pieces done) for the lines of a compressed text or JSON-lines file, decompressed in
    one pass: all of it for a whole file, else for each piece (a sample's window) the lines read once the
    compressed bytes reach its start, up to its width in bytes of text, stopping after the last. Progress goes
    by compressed bytes read."""
    uri, size = pieces[0].uri, pieces[0].size
    whole = not pieces[0].text_window
    width = sum(piece.width for piece in pieces)
    windows = [(piece.start, piece.width) for piece in pieces]
    taken, rest, counted = 0, b"", 0  # text taken in the current window; the unfinished line; bytes counted
    try:
        with storage.DecompressedFile(uri) as f:
            while windows:
                position = counted  # the compressed offset this read starts near (the decompressor reads ahead)
                chunk = f.read(_CHUNK_BYTES if whole else _MIN_WINDOW // 4)
                reading.read(f.compressed_bytes_read - counted)
                counted = f.compressed_bytes_read
                block = rest + chunk
                cut = block.rfind(b"\n") if chunk else len(block)
                if cut < 0:
                    rest = block
                    continue
                block, rest = block[:cut], block[cut + 1 :]
                if not whole:
                    while len(windows) > 1 and position >= windows[1][0]:  # passed a window: it starts here
                        windows, taken = windows[1:], 0
                    if position < windows[0][0]:
                        block = b""
                    else:
                        block, filled = _head_lines(block, windows[0][1] - taken)
                        taken += len(block) + 1
                        if filled:
                            windows, taken = windows[1:], 0
                if block or (chunk and whole):
                    done = min(counted, size) * width // max(size, 1)
                    for line in reading.decode_lines(block, uri):
                        yield (_jsonl_text(line, spec, uri) if pieces[0].file_format == "jsonl" else line), done
                if not chunk:
                    return
    except storage.DECOMPRESSION_ERRORS as error:
        raise _undecompressable(uri, error) from None


def _head_lines(block: bytes, budget: int) -> tuple[bytes, bool]:
    """The lines at the start of ``block`` that reach ``budget`` bytes (the one crossing it included), and
    whether they reach it; all of ``block`` when it is shorter."""
    if len(block) + 1 < budget:
        return block, False
    end = block.find(b"\n", max(budget - 1, 0))
    return (block if end < 0 else block[:end]), True


def _undecompressable(uri: str, error: Exception) -> InvalidParameter:
    return InvalidParameter(
        "corpus", uri, f"cannot be decompressed ({error}): the file is truncated, or not {storage.compression(uri)}"
    )


def _jsonl_text(line: str, spec: CorpusSpec, uri: str) -> str:
    if not line.strip():
        return ""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise InvalidParameter(
            "corpus", uri, f"is not JSON lines (one object per line; {error}); .json files are read as JSON lines"
        ) from None
    if not isinstance(row, dict) or spec.text_column not in row:
        raise _missing_column(spec, list(row) if isinstance(row, dict) else [], uri)
    return row[spec.text_column] or ""


def _parquet_texts(piece: FileSlice, spec: CorpusSpec, reading: Reading) -> Iterator[tuple[str, int]]:
    """The texts of the row groups of a parquet piece; a row group counts as read when it is."""
    import pyarrow.parquet as pq

    with storage.open_random_access(piece.uri) as f:
        parquet = pq.ParquetFile(f)
        if spec.text_column not in parquet.schema_arrow.names:
            raise _missing_column(spec, parquet.schema_arrow.names, piece.uri)
        metadata = parquet.metadata
        sizes = [metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups)]
        scale = piece.size / max(sum(sizes), 1)
        offset, done = 0, 0
        for index, group_size in enumerate(sizes):
            middle = (offset + group_size / 2) * scale
            offset += group_size
            if not piece.start <= middle < piece.end:
                continue
            table = parquet.read_row_group(index, columns=[spec.text_column])
            reading.read(int(group_size * scale))
            done = min(done + int(group_size * scale), piece.end - piece.start)
            for text in table.column(0).to_pylist():
                yield text or "", done


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
