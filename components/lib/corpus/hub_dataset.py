"""A Hugging Face Hub dataset, ``hf:NAME[:CONFIG[:SPLIT]]``, streamed. A part reads its share of the dataset's
file shards (``IterableDataset.shard``), split further into parquet row groups (``reshard``) when there are
fewer files than parts, else every N-th example (logged: each part then streams the whole dataset). A sample
is the head of each of its shards. Its size is not known before reading."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

from components.lib.corpus.reader import CorpusReader, Reading, Texts
from components.lib.corpus.spec import HUB_PREFIX, CorpusSpec
from components.lib.errors import InvalidParameter, first_line
from components.lib.hub import secret_token

log = logging.getLogger("tpu_mlm.corpus")


def parse_hub_name(source: str) -> tuple[str, str | None, str]:
    parts = source[len(HUB_PREFIX) :].split(":")
    if not parts[0] or len(parts) > 3 or any(not part for part in parts):
        raise InvalidParameter("corpus", source, "a Hub dataset is written hf:NAME[:CONFIG[:SPLIT]]")
    name, config, split = (*parts, None, None)[:3]
    return name, config, split or "train"


class HubDatasetReader(CorpusReader):
    def __init__(self, spec: CorpusSpec):
        super().__init__(spec)
        self.name, self.config, self.split = parse_hub_name(spec.corpus.strip())

    @property
    def total_bytes(self) -> None:
        return None

    # each loads the dataset when first iterated, not before: loading takes calls to the Hub

    def whole(self, reading: Reading) -> Texts:
        dataset = self._dataset()
        split_info = (dataset.info.splits or {}).get(self.split)
        yield from self._texts(iter(dataset), split_info.num_examples if split_info else None, reading)

    def part(self, num_parts: int, part: int, reading: Reading) -> Texts:
        yield from self._texts(self._part_rows(self._dataset(), num_parts, part), None, reading)

    def sample(self, sample_bytes: int, reading: Reading) -> Texts:
        yield from self._texts(self._sample_rows(self._dataset().reshard(), sample_bytes), None, reading)

    def _texts(self, rows: Iterator[dict[str, Any]], total: int | None, reading: Reading) -> Texts:
        try:
            for index, row in enumerate(rows):
                text = row[self.spec.text_column] or ""
                reading.read_text(len(text.encode("utf-8")))
                yield text, index / total if total else None
        finally:
            rows.close()  # the stream holds connections and reader threads

    def _dataset(self) -> Any:
        import datasets

        token = secret_token(self.spec.hf_token_secret) if self.spec.hf_token_secret else None  # else HF_TOKEN
        try:
            dataset = datasets.load_dataset(self.name, self.config, split=self.split, streaming=True, token=token)
        except Exception as error:  # the datasets library raises many types for a name it cannot load
            reason = first_line(error)
            raise InvalidParameter("corpus", self.spec.corpus, f"cannot load the Hub dataset: {reason}") from error
        if dataset.features is not None and self.spec.text_column not in dataset.features:
            raise self.spec.missing_column(list(dataset.features), self.spec.corpus)
        return dataset

    @staticmethod
    def _part_rows(dataset: Any, num_parts: int, part: int) -> Iterator[dict[str, Any]]:
        """This part's share of the dataset's file shards, or of its parquet row groups when there are fewer
        files than parts; else every N-th example."""
        if dataset.num_shards < num_parts:
            dataset = dataset.reshard()
        if dataset.num_shards >= num_parts:
            log.info("part %d of %d reads its share of %d dataset shards", part, num_parts, dataset.num_shards)
            yield from dataset.shard(num_parts, part)
            return
        log.warning(
            "the dataset has %d shard(s), fewer than the %d parts: each part streams the whole dataset and keeps "
            "every %d-th example",
            dataset.num_shards,
            num_parts,
            num_parts,
        )
        yield from itertools.islice(dataset, part, None, num_parts)

    def _sample_rows(self, dataset: Any, sample_bytes: int) -> Iterator[dict[str, Any]]:
        """The head of every shard (row group) of the dataset, an equal share of ``sample_bytes`` each."""
        shards = dataset.num_shards
        budget = sample_bytes / shards
        for index in range(shards):
            used = 0
            for row in dataset.shard(shards, index):
                yield row
                used += len(str(row.get(self.spec.text_column) or "").encode("utf-8"))
                if used >= budget:
                    break
