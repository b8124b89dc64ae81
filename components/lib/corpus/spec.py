"""How a step names its corpus: the ``--corpus`` forms, the column holding the text, and the limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter

EMBEDDED = "embedded"
HUB_PREFIX = "hf:"
FILE_FORMATS = {".txt": "text", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
EXPECTED_FORMS = (
    "'embedded', 'hf:NAME[:CONFIG[:SPLIT]]', or comma-separated local/gs:// paths or globs "
    f"of {', '.join(sorted(FILE_FORMATS))} files (all but .parquet also {'/'.join(storage.DECOMPRESSORS)})"
)
# the defaults of CorpusSpec (the readers' view) and CorpusArguments (the steps' flags) alike
TEXT_COLUMN = "text"
MAX_NON_UTF8_FRACTION = 0.001


@dataclass(frozen=True)
class CorpusSpec:
    """Where the text comes from, which column holds it, and how many texts to read at most."""

    source: str
    text_column: str = TEXT_COLUMN
    limit: int | None = None
    hf_token_secret: str = ""  # Secret Manager secret with a Hub token, for private hf: datasets; else HF_TOKEN
    max_non_utf8_fraction: float = MAX_NON_UTF8_FRACTION

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

    def missing_column(self, columns: list[str], where: str) -> InvalidParameter:
        return InvalidParameter("text_column", self.text_column, f"{where} has no such column; it has {columns}")


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
    text_column: str = field(
        default=TEXT_COLUMN, metadata={"help": "Column holding the text (Hub, JSON lines, Parquet)."}
    )
    limit: int = field(
        default=0,
        metadata={"help": "Read at most this many texts; 0: all. With parts, per part: N parts read up to N x limit."},
    )
    hf_token_secret: str = field(
        default="",
        metadata={"help": "Secret Manager secret holding a Hub token (private hf: datasets, the push); else HF_TOKEN."},
    )
    max_non_utf8_fraction: float = field(
        default=MAX_NON_UTF8_FRACTION,
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
