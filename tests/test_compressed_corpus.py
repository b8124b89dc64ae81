"""Corpora as users keep them: text and JSON lines compressed with gzip, zstd, bzip2 or xz, and files with
bytes that are not UTF-8. The reference for every compressed form is the same corpus as plain ``.txt``."""

import bz2
import gzip
import json
import logging
import lzma
from pathlib import Path

import pytest
from backports import zstd

from components.lib import storage
from components.lib.corpus import Corpus, CorpusSpec, embedded_lines
from components.lib.errors import InvalidParameter
from components.lib.estimates import EstimateArguments, data_size
from components.lib.shard_set import MANIFEST, merge_manifests
from components.shards import ShardArguments, write_shards
from components.tokenizer import TokenizerArguments, train_tokenizer
from pipelines.cli import main as tpu_mlm

COMPRESS = {".gz": gzip.compress, ".zst": zstd.compress, ".bz2": bz2.compress, ".xz": lzma.compress}
# the forms of the corpus: (suffix of its files, how a file's lines are written)
FORMS = {
    "txt": (".txt", None),
    "txt.gz": (".txt.gz", ".gz"),
    "jsonl.zst": (".jsonl.zst", ".zst"),
    "txt.bz2": (".txt.bz2", ".bz2"),
    "txt.xz": (".txt.xz", ".xz"),
}


def three_files(lines: list[str]) -> list[list[str]]:
    """The lines cut into three files of unequal sizes (a fifth, a third, the rest)."""
    cuts = [len(lines) // 5, len(lines) // 5 + len(lines) // 3]
    return [lines[: cuts[0]], lines[cuts[0] : cuts[1]], lines[cuts[1] :]]


def write_form(folder: Path, name: str, files: list[list[str]]) -> str:
    suffix, compression = FORMS[name]
    paths = []
    for index, lines in enumerate(files):
        if suffix.startswith(".jsonl"):
            data = "".join(json.dumps({"text": line}) + "\n" for line in lines).encode()
        else:
            data = "".join(line + "\n" for line in lines).encode()
        path = folder / f"corpus-{index}{suffix}"
        path.write_bytes(COMPRESS[compression](data) if compression else data)
        paths.append(str(path))
    return ",".join(paths)


@pytest.fixture(scope="module")
def corpus_lines(wikitext) -> list[str]:
    return (wikitext / "valid.txt").read_text().splitlines()


@pytest.fixture(scope="module")
def forms(tmp_path_factory, corpus_lines) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("forms")
    return {name: write_form(folder, name, three_files(corpus_lines)) for name in FORMS}


def records(shards: str) -> list[bytes]:
    import tensorflow as tf

    manifest = json.loads(storage.read_text(storage.join(shards, MANIFEST)))
    files = [storage.join(shards, file["name"]) for file in manifest["files"]]
    return [record.numpy() for record in tf.data.TFRecordDataset(files)]


def shard(corpus: str, output: str, tokenizer: str, num_parts: int = 1) -> dict:
    for part in range(num_parts):
        manifest = write_shards(
            ShardArguments(output=output, tokenizer=tokenizer, corpus=corpus, num_parts=num_parts, part=part)
        )
    return manifest if num_parts == 1 else merge_manifests(output)


@pytest.mark.slow  # five forms, each sharded whole and in three parts: about 40 s
@pytest.mark.parametrize("num_parts", [1, 3])
def test_every_compressed_form_gives_the_same_records_as_plain_text(
    forms, corpus_lines, wikitext_tokenizer, tmp_path, num_parts
):
    results = {
        name: shard(corpus, str(tmp_path / name), wikitext_tokenizer, num_parts) for name, corpus in forms.items()
    }
    expected = records(str(tmp_path / "txt"))
    assert len(expected) > 100
    text_bytes = sum(len(line.encode()) + 1 for line in corpus_lines)
    for name, manifest in results.items():
        assert records(str(tmp_path / name)) == expected, name  # the same samples, byte for byte, in order
        compressed = sum(Path(path).stat().st_size for path in forms[name].split(","))
        assert manifest["bytes_read"] == compressed, name  # what was read from storage
        assert manifest["non_utf8_bytes"] == 0
        if not name.startswith("jsonl"):  # JSON lines hold more than the text
            assert manifest["text_bytes"] == text_bytes, name
    assert results["txt.xz"]["bytes_read"] < results["txt"]["bytes_read"] / 2


@pytest.mark.slow  # trains in the test: out of the fast tier (make test-fast under 3 minutes)
def test_a_compressed_file_on_gs_gives_the_records_of_the_local_text(gcs, forms, wikitext_tokenizer, tmp_path):
    local = shard(forms["txt"], str(tmp_path / "txt"), wikitext_tokenizer, num_parts=3)
    uris = []
    for path in forms["jsonl.zst"].split(","):
        uris.append(storage.join(gcs, "corpus", Path(path).name))
        storage.write_bytes_atomic(uris[-1], Path(path).read_bytes())
    remote = shard(",".join(uris), storage.join(gcs, "shards"), wikitext_tokenizer, num_parts=3)
    assert records(storage.join(gcs, "shards")) == records(str(tmp_path / "txt"))
    assert remote["num_records"] == local["num_records"]


def test_a_truncated_file_fails_in_one_line_naming_it_and_nothing_is_published(
    corpus_lines, wikitext_tokenizer, tmp_path, capsys
):
    whole = gzip.compress("".join(line + "\n" for line in corpus_lines).encode())
    cut = tmp_path / "valid.txt.gz"
    cut.write_bytes(whole[: len(whole) * 3 // 5])  # its first texts read well: the error comes while sharding
    output = tmp_path / "shards"
    job = ["shards", "--corpus", str(cut), "--tokenizer", wikitext_tokenizer, "--output", str(output)]
    code = tpu_mlm([*job, "--records_per_shard", "500"])  # shards are published before the error
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert last_line == (
        f"error: --corpus='{cut}': cannot be decompressed (Compressed file ended before the end-of-stream marker was "
        "reached): the file is truncated, or not .gz"
    )
    assert not (output / MANIFEST).exists() and not list(output.rglob("*.json"))
    assert not list(output.rglob("*.tfrecord")) and not list(output.rglob("*.partial"))  # none a reader takes


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_few_bytes_that_are_not_utf8_are_replaced_counted_and_named(
    corpus_lines, embedded_tokenizer, tmp_path, caplog
):
    path = tmp_path / "valid.txt"
    text = "".join(line + "\n" for line in corpus_lines[:2000]).encode()
    path.write_bytes(b"Caf\xe9 cr\xe8me\n" + text)  # two Latin-1 bytes at the top, as in a copy of WikiText-2
    with caplog.at_level(logging.WARNING, logger="tpu_mlm.corpus"):
        manifest = write_shards(
            ShardArguments(output=str(tmp_path / "shards"), tokenizer=embedded_tokenizer, corpus=str(path))
        )
        summary = train_tokenizer(
            TokenizerArguments(output=str(tmp_path / "tokenizer"), corpus=str(path), vocab_size=500)
        )
    assert manifest["non_utf8_bytes"] == 2 and summary["non_utf8_bytes"] == 2
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert sum(f"{path}: 2 byte(s) that are not UTF-8 replaced with U+FFFD" in message for message in warnings) == 2
    corpus = Corpus(CorpusSpec(corpus=str(path)))
    assert next(iter(corpus)) == "Caf\ufffd cr\ufffdme"


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_file_in_another_encoding_fails_early_unless_the_limit_allows_it(embedded_tokenizer, tmp_path):
    path = tmp_path / "french.txt.xz"
    text = "Un café crème et une crêpe, à la française.\n" * 100_000  # 4.4 MB, 11% of the bytes Latin-1 letters
    path.write_bytes(lzma.compress(text.encode("latin-1")))
    output = tmp_path / "shards"
    with pytest.raises(InvalidParameter) as error:
        write_shards(ShardArguments(output=str(output), tokenizer=embedded_tokenizer, corpus=str(path)))
    assert error.value.parameter == "corpus" and error.value.value == str(path)
    assert "11.36% of its bytes are not UTF-8" in error.value.expected
    read = int(error.value.expected.split("(")[1].split(" of ")[1].split()[0].replace(",", ""))
    assert read < len(text) / 2  # judged on its first block, before anything is written
    assert not output.exists() or not list(output.iterdir())
    manifest = write_shards(
        ShardArguments(output=str(output), tokenizer=embedded_tokenizer, corpus=str(path), max_non_utf8_fraction=0.2)
    )
    assert manifest["non_utf8_bytes"] == 5 * 100_000


def test_a_sample_of_a_compressed_file_is_spread_over_it_and_about_its_size(forms, corpus_lines):
    one_file = forms["txt.gz"].split(",")[2]  # the largest
    corpus = Corpus(CorpusSpec(corpus=one_file), sample_bytes=150_000)
    texts = list(corpus)
    sample_bytes = sum(len(text.encode()) + 1 for text in texts)
    assert corpus.sampled and abs(sample_bytes / 150_000 - 1) < 0.05
    text = "".join(line + "\n" for line in three_files(corpus_lines)[2])
    first, last = text.find(texts[0] + "\n") / len(text), text.rfind(texts[-1] + "\n") / len(text)
    assert first < 0.05 and last > 0.45  # two windows of 75 KB of text, at 0 and at half of the compressed bytes
    assert corpus.bytes_read <= Path(one_file).stat().st_size


def test_files_that_expand_unlike_each_other_are_sampled_and_sized_each_by_its_own(tmp_path, forms, corpus_lines):
    """A first file of repeated text (it expands hundreds of times) before real text: the sample still comes
    from every file, by its share of the compressed bytes, and the estimate stays near the text's size."""
    repeated = tmp_path / "0-repeated.txt.gz"
    repeated.write_bytes(gzip.compress(b"the same line again\n" * 200_000))
    corpus = ",".join([str(repeated), *forms["txt.gz"].split(",")])
    sample = Corpus(CorpusSpec(corpus=corpus), sample_bytes=300_000)
    texts = list(sample)
    assert abs(sum(len(text.encode()) + 1 for text in texts) / 300_000 - 1) < 0.1
    real = sum(len(text.encode()) + 1 for text in texts if text != "the same line again")
    assert real > 0.9 * 300_000  # the repeated file is a sliver of the compressed bytes, and of the sample
    text_bytes = len(b"the same line again\n") * 200_000 + sum(len(line.encode()) + 1 for line in corpus_lines)
    estimated, _ = Corpus(CorpusSpec(corpus=corpus)).reader.estimated_text_bytes()
    assert abs(estimated / text_bytes - 1) < 0.5  # probes of every file here; a first-file guess was 90x off


def test_the_estimate_sizes_a_compressed_corpus_as_its_text(forms):
    plain = data_size(EstimateArguments(corpus=forms["txt"]))
    compressed = data_size(EstimateArguments(corpus=forms["txt.gz"]))
    assert abs(compressed["samples"] / plain["samples"] - 1) < 0.1
    assert "bytes of text per stored byte" in compressed["source"]


def test_byte_order_marks_suffixes_in_capitals_and_long_window_zstd(tmp_path, corpus_lines):
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfhello\nworld\n")  # UTF-8's mark, as Windows editors write
    assert list(Corpus(CorpusSpec(corpus=str(tmp_path / "bom.txt")))) == ["hello", "world"]
    (tmp_path / "wide.txt.gz").write_bytes(gzip.compress("hello\nworld\n".encode("utf-16")))
    with pytest.raises(InvalidParameter, match=r"is UTF-16 .* re-encode it as UTF-8"):
        list(Corpus(CorpusSpec(corpus=str(tmp_path / "wide.txt.gz"))))
    text = "".join(line + "\n" for line in corpus_lines[:500]).encode()
    (tmp_path / "SHOUT.TXT.GZ").write_bytes(gzip.compress(text))
    assert list(Corpus(CorpusSpec(corpus=str(tmp_path / "SHOUT.TXT.GZ")))) == [
        line for line in corpus_lines[:500] if line.strip()
    ]
    # zstd --long=31: a window above the decoder's default limit (refused without the project's option)
    options = {zstd.CompressionParameter.window_log: 31, zstd.CompressionParameter.enable_long_distance_matching: 1}
    with zstd.open(tmp_path / "long.txt.zst", "wb", options=options) as f:  # streamed: the frame keeps 2 GiB
        f.write(text)
    assert len(list(Corpus(CorpusSpec(corpus=str(tmp_path / "long.txt.zst"))))) == len(
        list(Corpus(CorpusSpec(corpus=str(tmp_path / "SHOUT.TXT.GZ"))))
    )


def test_a_sample_larger_than_a_small_compressed_file_s_bytes_keeps_its_size(tmp_path):
    """A file whose sample (in text) is larger than its compressed bytes: the last window is not cut at them
    (it was, and the sample came to two thirds of what was asked)."""
    text = "".join(line + "\n" for line in embedded_lines())
    small = tmp_path / "small.txt.gz"
    small.write_bytes(gzip.compress(text.encode()))
    assert small.stat().st_size < 150_000 < len(text.encode())
    corpus = Corpus(CorpusSpec(corpus=str(small)), sample_bytes=150_000)
    sampled = sum(len(line.encode()) + 1 for line in corpus)
    assert corpus.sampled and abs(sampled / 150_000 - 1) < 0.05, sampled
