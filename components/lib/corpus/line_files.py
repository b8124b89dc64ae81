"""Text and JSON-lines files, plain or compressed: the texts of the lines that start in a byte range, read a
block at a time; a compressed file in one pass, its pieces (a sample's windows) taken as the pass reaches them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from components.lib import storage
from components.lib.corpus.file_slice import CHUNK_BYTES, LINE_STEP, MIN_WINDOW, FileSlice, undecompressable
from components.lib.corpus.reader import Reading
from components.lib.corpus.spec import CorpusSpec
from components.lib.errors import InvalidParameter


def line_texts(piece: FileSlice, spec: CorpusSpec, reading: Reading) -> Iterator[tuple[str, int]]:
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
            chunk = f.read(min(CHUNK_BYTES, end - reached) if reached < end else LINE_STEP)
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


def compressed_line_texts(pieces: list[FileSlice], spec: CorpusSpec, reading: Reading) -> Iterator[tuple[str, int]]:
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
                chunk = f.read(CHUNK_BYTES if whole else MIN_WINDOW // 4)
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
        raise undecompressable(uri, error) from None


def _head_lines(block: bytes, budget: int) -> tuple[bytes, bool]:
    """The lines at the start of ``block`` that reach ``budget`` bytes (the one crossing it included), and
    whether they reach it; all of ``block`` when it is shorter."""
    if len(block) + 1 < budget:
        return block, False
    end = block.find(b"\n", max(budget - 1, 0))
    return (block if end < 0 else block[:end]), True


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
