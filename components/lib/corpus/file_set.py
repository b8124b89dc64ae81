"""Files, local or ``gs://``: paths or globs, comma-separated. ``.txt`` (one document per line), ``.jsonl`` and
``.parquet`` (with a text column); text and JSON lines also compressed (``.txt.gz``, ``.jsonl.zst``,
``.json.bz2``, ``.txt.xz``, ...). This module lays the files out (which pieces a part or a sample takes:
``FileSlice``); ``line_files`` reads text and JSON lines, decompressing as they stream, in bounded memory, and
``parquet_files`` reads Parquet.

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
import math
import sys
from dataclasses import replace

from components.lib import storage
from components.lib.corpus.file_slice import CHUNK_BYTES, MIN_WINDOW, FileSlice, undecompressable
from components.lib.corpus.line_files import compressed_line_texts, line_texts
from components.lib.corpus.parquet_files import parquet_texts
from components.lib.corpus.reader import CorpusReader, Reading, Texts
from components.lib.corpus.spec import EXPECTED_FORMS, FILE_FORMATS, CorpusSpec
from components.lib.errors import InvalidParameter

_SAMPLE_WINDOWS = 1024  # a sample is read as at most this many windows (of at least MIN_WINDOW bytes)


class FilesReader(CorpusReader):
    def __init__(self, spec: CorpusSpec):
        super().__init__(spec)
        self.files = _resolve_files(spec.corpus.strip())  # (uri, format, size) in the corpus's order
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
                readers = [(compressed_line_texts(pieces, self.spec, reading), pieces)]
            else:
                reader = parquet_texts if pieces[0].file_format == "parquet" else line_texts
                readers = [(reader(piece, self.spec, reading), [piece]) for piece in pieces]
            for texts, covered in readers:  # each tells how many bytes of its pieces it has done
                for text, reader_done in texts:
                    yield text, min((done + reader_done) / planned, 1.0)
                done += sum(piece.width for piece in covered)
            reading.finish_file(uri)


def _sample_windows(sample_bytes: int, total: int) -> list[tuple[int, int]]:
    """Byte ranges of about ``sample_bytes`` in all, evenly spaced over ``total`` bytes."""
    windows = max(1, min(_SAMPLE_WINDOWS, sample_bytes // MIN_WINDOW))
    width = sample_bytes / windows
    return [(int(i * total / windows), int(i * total / windows + width)) for i in range(windows)]


def _expansion(uri: str) -> float:
    """Bytes of text per compressed byte in the first MiB of a compressed file."""
    text = 0
    try:
        with storage.DecompressedFile(uri) as f:
            while f.compressed_bytes_read < CHUNK_BYTES and (chunk := f.read(CHUNK_BYTES)):
                text += len(chunk)
            return text / max(f.compressed_bytes_read, 1)
    except storage.DECOMPRESSION_ERRORS as error:
        raise undecompressable(uri, error) from None


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
