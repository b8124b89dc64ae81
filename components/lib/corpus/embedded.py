"""The embedded corpus: the English documentation text that CPython ships in ``pydoc_data`` (about 465 KB), so
that a first run needs no network and no data. Parts are contiguous runs of its lines; a sample, lines spread
evenly over it."""

from __future__ import annotations

import math
from functools import cached_property

from components.lib.corpus.reader import CorpusReader, Reading, Texts


def embedded_lines() -> list[str]:
    """The embedded corpus: the lines of CPython's ``pydoc_data`` topics, in a fixed order."""
    from pydoc_data.topics import topics

    return [line for key in sorted(topics) for line in topics[key].splitlines()]


class EmbeddedReader(CorpusReader):
    @cached_property
    def lines(self) -> list[str]:
        return embedded_lines()

    @cached_property
    def total_bytes(self) -> int:
        return sum(len(line.encode("utf-8")) + 1 for line in self.lines)

    def whole(self, reading: Reading) -> Texts:
        return self._lines(range(len(self.lines)), reading)

    def part(self, num_parts: int, part: int, reading: Reading) -> Texts:
        count = len(self.lines)
        return self._lines(range(count * part // num_parts, count * (part + 1) // num_parts), reading)

    def describe_part(self, num_parts: int, part: int) -> str:
        count = len(self.lines)
        return f"part {part} of {num_parts}: lines {count * part // num_parts:,} to {count * (part + 1) // num_parts:,}"

    def sample(self, sample_bytes: int, reading: Reading) -> Texts:
        share = sample_bytes / self.total_bytes
        count = len(self.lines)
        return self._lines([i for i in range(count) if math.floor((i + 1) * share) > math.floor(i * share)], reading)

    def _lines(self, chosen: range | list[int], reading: Reading) -> Texts:
        for done, index in enumerate(chosen):
            reading.read_text(len(self.lines[index].encode("utf-8")) + 1)
            yield self.lines[index], done / max(len(chosen), 1)
