"""What a files reader takes of one file (``FileSlice``), and the read sizes the file readers share."""

from __future__ import annotations

from dataclasses import dataclass

from components.lib import storage
from components.lib.errors import InvalidParameter

CHUNK_BYTES = 1 << 20
LINE_STEP = 4096  # past the end of its range, a reader finishes its last line in reads of this size
MIN_WINDOW = 1 << 16  # a sample's window is at least this many bytes


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


def undecompressable(uri: str, error: Exception) -> InvalidParameter:
    return InvalidParameter(
        "corpus", uri, f"cannot be decompressed ({error}): the file is truncated, or not {storage.compression(uri)}"
    )
