"""Files, local or ``gs://``: paths or globs, comma-separated. ``.txt`` (one document per line), ``.jsonl`` and
``.parquet`` (with a text column); text and JSON lines also compressed (``.txt.gz``, ``.jsonl.zst``,
``.json.bz2``, ``.txt.xz``, ...), decompressed as they stream, in bounded memory.

**Parts.** The files laid end to end are cut into N equal byte ranges. With at least N files, each file goes
whole to the part holding its middle byte (whole files, balanced by size, in order). With fewer, text and
JSON-lines files are read by byte range: a part starts at the first line that starts inside its range and ends
with the line that crosses its end; parquet files by row group (the part holding its middle byte). A compressed
file cannot be cut by byte range: a corpus with one needs at least N files.

**Samples.** Windows of the files evenly spaced from start to end (lines cut as for parts). The text of a
compressed file has no offsets to seek to: its windows start where its compressed bytes reach their place and
take their width in text, and the file is decompressed in one pass up to its last window.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from components.lib import storage
from components.lib.corpus.reader import CorpusReader, Reading, Texts
from components.lib.corpus.spec import EXPECTED_FORMS, FILE_FORMATS, CorpusSpec
from components.lib.errors import InvalidParameter

_CHUNK_BYTES = 1 << 20
LINE_STEP = 4096  # past the end of its range, a reader finishes its last line in reads of this size
_SAMPLE_WINDOWS = 1024  # a sample is read as at most this many windows ...
_MIN_WINDOW = 1 << 16  # ... of at least this many bytes


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


class FilesReader(CorpusReader):
    def __init__(self, spec: CorpusSpec):
        super().__init__(spec)
        self.files = _resolve_files(spec.source.strip())  # (uri, format, size) in the corpus's order
        self.compressed = [(uri, size) for uri, _, size in self.files if storage.compression(uri)]

    @property
    def total_bytes(self) -> int:
        return sum(size for _, _, size in self.files)

    def takes_sample(self, sample_bytes: int) -> bool:
        return bool(self.compressed) or sample_bytes < self.total_bytes  # a compressed file's text size is unknown

    def estimated_text_bytes(self, probes: int = 8) -> tuple[int, float]:
        """The bytes of text per compressed byte are measured on the first MiB of up to ``probes`` compressed
        files spread over the corpus, weighted by their sizes."""
        if not self.compressed:
            return self.total_bytes, 1.0
        probed = self.compressed[:: max(1, math.ceil(len(self.compressed) / probes))]
        expansion = sum(_expansion(uri) * size for uri, size in probed) / max(sum(size for _, size in probed), 1)
        compressed_bytes = sum(size for _, size in self.compressed)
        return self.total_bytes - compressed_bytes + int(expansion * compressed_bytes), expansion

    def whole(self, reading: Reading) -> Texts:
        return self.read(self.whole_slices(), reading)

    def part(self, num_parts: int, part: int, reading: Reading) -> Texts:
        return self.read(self.part_slices(num_parts, part), reading)

    def sample(self, sample_bytes: int, reading: Reading) -> Texts:
        return self.read(self.sample_slices(sample_bytes), reading)

    def describe_part(self, num_parts: int, part: int) -> str:
        slices = self.part_slices(num_parts, part)
        return (
            f"part {part} of {num_parts}: {sum(piece.width for piece in slices):,} of the corpus's "
            f"{self.total_bytes:,} bytes, in {len(slices)} piece(s) of {len({piece.uri for piece in slices})} file(s)"
        )

    # -- which pieces of which files -------------------------------------------------------------------------

    def whole_slices(self) -> list[FileSlice]:
        return [FileSlice(uri, fmt, size, 0, size) for uri, fmt, size in self.files]

    def part_slices(self, num_parts: int, part: int) -> list[FileSlice]:
        total = self.total_bytes
        if self.compressed and len(self.files) < num_parts:
            raise InvalidParameter(
                "num_parts",
                num_parts,
                f"the corpus has {len(self.files)} file(s), {len(self.compressed)} of them compressed, and a "
                f"compressed file cannot be cut into parts: use num_parts <= {len(self.files)}, or a corpus of at "
                f"least {num_parts} files",
            )
        if len(self.files) >= num_parts:  # whole files, each to the part that holds its middle byte
            slices, offset = [], 0
            for uri, fmt, size in self.files:
                if _part_of(offset + size / 2, total, num_parts) == part:
                    slices.append(FileSlice(uri, fmt, size, 0, size))
                offset += size
            return slices
        bounds = [int(k * total / num_parts) for k in range(num_parts + 1)]
        return _file_slices(self.files, [(bounds[part], bounds[part + 1])])

    def sample_slices(self, sample_bytes: int) -> list[FileSlice]:
        """A sample's windows, spread evenly over the corpus's stored bytes. A window in a compressed file starts
        at its compressed offset and takes its width in bytes of text (the text's size is not known). A window
        is split where a file ends, except at the end of the corpus when its last file is compressed: that file's
        text outlasts its bytes, and a last window cut at its bytes would leave the sample short (a small file,
        whose sample is larger than its compressed bytes, lost a third of it)."""
        files = list(self.files)
        if storage.compression(files[-1][0]):
            files[-1] = (*files[-1][:2], sys.maxsize)
        sizes = {uri: size for uri, _, size in self.files}
        windows = _file_slices(files, _sample_windows(sample_bytes, self.total_bytes))
        return [
            replace(piece, size=sizes[piece.uri], text_window=True) if piece.compressed else piece for piece in windows
        ]

    # -- reading them ------------------------------------------------------------------------------------------

    def read(self, slices: list[FileSlice], reading: Reading) -> Texts:
        """The texts of the pieces, a file at a time (its pieces are next to each other)."""
        planned = max(sum(piece.width for piece in slices), 1)
        done = 0
        for uri, group in itertools.groupby(slices, key=lambda piece: piece.uri):
            pieces = list(group)
            if pieces[0].compressed:  # one pass over the file, whatever its pieces
                readers = [(_compressed_line_texts(pieces, self.spec, reading), pieces)]
            else:
                reader = _parquet_texts if pieces[0].file_format == "parquet" else _line_texts
                readers = [(reader(piece, self.spec, reading), [piece]) for piece in pieces]
            for texts, covered in readers:  # each tells how many bytes of its pieces it has done
                for text, reader_done in texts:
                    yield text, min((done + reader_done) / planned, 1.0)
                done += sum(piece.width for piece in covered)
            reading.finish_file(uri)


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
        raise spec.missing_column(list(row) if isinstance(row, dict) else [], uri)
    return row[spec.text_column] or ""


def _parquet_texts(piece: FileSlice, spec: CorpusSpec, reading: Reading) -> Iterator[tuple[str, int]]:
    """The texts of the row groups of a parquet piece; a row group counts as read when it is."""
    import pyarrow.parquet as pq

    with storage.open_random_access(piece.uri) as f:
        parquet = pq.ParquetFile(f)
        if spec.text_column not in parquet.schema_arrow.names:
            raise spec.missing_column(parquet.schema_arrow.names, piece.uri)
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
