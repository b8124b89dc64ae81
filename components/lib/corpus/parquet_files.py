"""Parquet files: the texts of a text column, a row group at a time."""

from __future__ import annotations

from collections.abc import Iterator

from components.lib import storage
from components.lib.corpus.file_slice import FileSlice
from components.lib.corpus.reader import Reading
from components.lib.corpus.spec import CorpusSpec


def parquet_texts(piece: FileSlice, spec: CorpusSpec, reading: Reading) -> Iterator[tuple[str, int]]:
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
