"""What every corpus reader shares: the three shares it can read, and the counts of one pass (``Reading``)."""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator

from components.lib.corpus.spec import CorpusSpec
from components.lib.errors import InvalidParameter

log = logging.getLogger("tpu_mlm.corpus")

_UTF8_CHECK_BYTES = 1 << 16  # a file's share of bytes that are not UTF-8 is judged once this much is read
_ESCAPED_BYTES = re.compile("[\udc80-\udcff]")  # what "surrogateescape" makes of a byte that is not UTF-8

# (text, fraction of the share done or None when unknown), for progress lines
Texts = Iterator[tuple[str, float | None]]


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


class CorpusReader(ABC):
    """One kind of corpus. It is checked when opened (names, files, formats), then gives the texts of the whole
    corpus, of part K of N (the N parts together read each text once, in the corpus's order), or of a sample of
    about B bytes spread over it, the same in every run. Every method yields (text, fraction done); the caller
    (``Corpus``) skips blanks, applies the limit and keeps the counts."""

    def __init__(self, spec: CorpusSpec):
        self.spec = spec

    @property
    @abstractmethod
    def total_bytes(self) -> int | None:
        """The corpus's stored bytes, known before reading; ``None`` when they are not."""

    def takes_sample(self, sample_bytes: int) -> bool:
        """Whether a sample of ``sample_bytes`` is less than reading it all."""
        return self.total_bytes is None or sample_bytes < self.total_bytes

    def estimated_text_bytes(self) -> tuple[int | None, float]:
        """The corpus's bytes of text, and the bytes of text per stored byte that assumes."""
        return self.total_bytes, 1.0

    def describe_part(self, num_parts: int, part: int) -> str:
        return f"part {part} of {num_parts}"

    @abstractmethod
    def whole(self, reading: Reading) -> Texts: ...

    @abstractmethod
    def part(self, num_parts: int, part: int, reading: Reading) -> Texts:
        """Checks that the corpus can be cut so at once, then returns the part's texts."""

    @abstractmethod
    def sample(self, sample_bytes: int, reading: Reading) -> Texts: ...
