"""Sharding throughput against its limit: the fast tokenizer's batched encoding of the same texts alone.

Both run in the same process on the same cores, alternating, on WikiText-2 (``../shared/data``) by default:

* limit: ``Tokenizer.encode_batch_fast`` over the texts already in memory, batch by batch, nothing else;
* sharding: ``components.shards.write_shards`` end to end: read the files, tokenize, pack into samples,
  serialize ``tf.train.Example`` records, write and publish the TFRecord shards and the manifest;
* sharding the same files compressed (``--compression``, gzip by default), which must give the same samples.

It prints tokens/s for each (median of the repeats) and their ratios, and writes the figures as JSON.

    python benchmarks/shard_throughput.py [--corpus FILES] [--copies 4] [--repeats 5] [--compression .zst]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

import components  # noqa: F401  (environment for TensorFlow)
from components.lib import storage
from components.lib.corpus import Corpus, CorpusSpec
from components.lib.tokenization import load_tokenizer
from components.shards import ShardArguments, write_shards
from components.tokenizer import TokenizerArguments, train_tokenizer

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"


@dataclass
class BenchmarkArguments:
    corpus: str = field(
        default=f"{WIKITEXT / 'valid.txt'},{WIKITEXT / 'test.txt'}", metadata={"help": "Corpus to shard."}
    )
    copies: int = field(default=4, metadata={"help": "Read the corpus this many times over, for longer runs."})
    repeats: int = field(default=5, metadata={"help": "Timed runs of each side; the median is reported."})
    vocab_size: int = field(default=8000, metadata={"help": "Vocabulary of the tokenizer trained first."})
    batch_size: int = field(default=1000, metadata={"help": "Texts per tokenization batch, on both sides."})
    compression: str = field(
        default=".gz", metadata={"help": f"Also shard the files compressed so: one of {list(storage.DECOMPRESSORS)}."}
    )
    output: str = field(default="benchmarks/results/shard_throughput.json", metadata={"help": "JSON results."})


def main() -> None:
    (arguments,) = HfArgumentParser(BenchmarkArguments, allow_abbrev=False).parse_args_into_dataclasses()
    corpus = ",".join([arguments.corpus] * arguments.copies)
    with tempfile.TemporaryDirectory() as work:
        compressed_files = {}  # each file of the corpus, compressed with the library a user's tool would use
        for index, path in enumerate(arguments.corpus.split(",")):
            compressed_files[path] = os.path.join(work, f"{index}-{Path(path).name}{arguments.compression}")
            with (
                open(path, "rb") as source,
                storage.DECOMPRESSORS[arguments.compression](compressed_files[path], "wb") as target,
            ):
                shutil.copyfileobj(source, target)
        compressed_corpus = ",".join([",".join(compressed_files.values())] * arguments.copies)
        tokenizer_dir = os.path.join(work, "tokenizer")
        train_tokenizer(
            TokenizerArguments(output=tokenizer_dir, corpus=arguments.corpus, vocab_size=arguments.vocab_size)
        )
        backend = load_tokenizer(tokenizer_dir)[0].backend_tokenizer
        texts = list(Corpus(CorpusSpec(corpus=corpus)))
        batches = [texts[i : i + arguments.batch_size] for i in range(0, len(texts), arguments.batch_size)]
        tokens = sum(len(encoding.ids) for batch in batches for encoding in backend.encode_batch_fast(batch))

        def encode_only() -> float:
            started = time.perf_counter()
            for batch in batches:
                backend.encode_batch_fast(batch)
            return time.perf_counter() - started

        def shard(run: int, source: str) -> float:
            output = os.path.join(work, f"shards-{run}")
            started = time.perf_counter()
            manifest = write_shards(
                ShardArguments(output=output, tokenizer=tokenizer_dir, corpus=source, batch_size=arguments.batch_size)
            )
            seconds = time.perf_counter() - started
            assert manifest["tokens_written"] + manifest["tokens_dropped"] == tokens
            shutil.rmtree(output)
            return seconds

        encode_only()  # warm-up: thread pool, page cache
        limit_seconds, shard_seconds, compressed_seconds = [], [], []
        for run in range(arguments.repeats):
            limit_seconds.append(encode_only())
            shard_seconds.append(shard(run, corpus))
            compressed_seconds.append(shard(run, compressed_corpus))
        compressed_bytes = sum(os.path.getsize(path) for path in compressed_files.values())

    limit = tokens / statistics.median(limit_seconds)
    sharding = tokens / statistics.median(shard_seconds)
    compressed = tokens / statistics.median(compressed_seconds)
    plain_bytes = sum(os.path.getsize(path) for path in arguments.corpus.split(","))
    result = {
        "command": "python " + " ".join(sys.argv),
        "cpu_count": os.cpu_count(),
        "texts": len(texts),
        "tokens": tokens,
        "encode_only_tokens_per_s": round(limit),
        "sharding_tokens_per_s": round(sharding),
        "ratio": round(sharding / limit, 3),
        "compression": arguments.compression,
        "compressed_bytes_per_text_byte": round(compressed_bytes / plain_bytes, 3),
        "compressed_sharding_tokens_per_s": round(compressed),
        "compressed_vs_plain": round(compressed / sharding, 3),
        "encode_only_seconds": limit_seconds,
        "sharding_seconds": shard_seconds,
        "compressed_sharding_seconds": compressed_seconds,
        "arguments": asdict(arguments),
    }
    Path(arguments.output).parent.mkdir(parents=True, exist_ok=True)
    Path(arguments.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(texts):,} texts, {tokens:,} tokens, {os.cpu_count()} cores, median of {arguments.repeats} runs")
    print(f"  encode only (limit): {limit:>12,.0f} tokens/s")
    print(f"  sharding:            {sharding:>12,.0f} tokens/s")
    print(f"  ratio:               {sharding / limit:>12.2f}")
    print(
        f"  sharding {arguments.compression} files: {compressed:>9,.0f} tokens/s ({compressed / sharding:.2f} x plain)"
    )


if __name__ == "__main__":
    main()
