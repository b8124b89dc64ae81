"""How a step names its corpus: the ``--corpus`` forms, the column holding the text, and the limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.hub import HubToken

EMBEDDED = "embedded"
HUB_PREFIX = "hf:"
FILE_FORMATS = {".txt": "text", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
EXPECTED_FORMS = (
    "'embedded', 'hf:NAME[:CONFIG[:SPLIT]]', or comma-separated local/gs:// paths or globs "
    f"of {', '.join(sorted(FILE_FORMATS))} files (all but .parquet also {'/'.join(storage.DECOMPRESSORS)})"
)


@dataclass(kw_only=True)
class CorpusSpec(HubToken):
    """Where the text comes from, which column holds it, and how many texts to read at most: what the readers
    take, and the corpus flags of the tokenizer and shards steps (and the pipeline), which extend it."""

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
    max_non_utf8_fraction: float = field(
        default=0.001,
        metadata={
            "help": "Refuse a corpus file when more than this share of its bytes are not UTF-8; fewer are replaced "
            "with U+FFFD and counted (a warning, and non_utf8_bytes in the manifest)."
        },
    )

    def __post_init__(self) -> None:
        if not self.corpus or not self.corpus.strip():
            raise InvalidParameter("corpus", self.corpus, f"name a corpus: {EXPECTED_FORMS}")
        if self.limit < 0:
            raise InvalidParameter("limit", self.limit, "must be a positive number of texts, or 0 for all")
        if not self.text_column:
            raise InvalidParameter("text_column", self.text_column, "must name the column holding the text")
        if not 0 <= self.max_non_utf8_fraction <= 1:
            raise InvalidParameter(
                "max_non_utf8_fraction", self.max_non_utf8_fraction, "must be a share of a file's bytes, 0 to 1"
            )

    def describe(self) -> dict[str, Any]:
        return {"source": self.corpus, "text_column": self.text_column, "limit": self.limit or None}

    def missing_column(self, columns: list[str], where: str) -> InvalidParameter:
        return InvalidParameter("text_column", self.text_column, f"{where} has no such column; it has {columns}")
