import json
import re
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from conftest import WIKITEXT_VOCAB_SIZE, run_at, run_module
from transformers import AutoTokenizer

from components.lib.corpus import LINE_STEP, embedded_lines
from components.lib.errors import InvalidParameter
from components.lib.shard_set import MANIFEST, merge_manifests, read_manifest
from components.shards import ShardArguments, write_shards


def read_records(folder: str, max_length: int) -> np.ndarray:
    """Reads every shard the way the reference recipe does: glob, TFRecordDataset, FixedLenFeature."""
    files = sorted(tf.io.gfile.glob(f"{folder}/*.tfrecord"))
    spec = {name: tf.io.FixedLenFeature([max_length], tf.int64) for name in ("input_ids", "attention_mask")}
    rows = [tf.io.parse_single_example(record, spec) for record in tf.data.TFRecordDataset(files)]
    for row in rows:
        assert (row["attention_mask"].numpy() == 1).all()
    return np.array([row["input_ids"].numpy() for row in rows]).reshape(-1, max_length)


def tokenized_stream(tokenizer_dir: str, texts: list[str]) -> np.ndarray:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return np.concatenate(tokenizer(texts)["input_ids"])


def nonblank_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def shard_names(folder: str) -> list[str]:
    return sorted(p.name for p in Path(folder).glob("*.tfrecord"))


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_shards_hold_every_token_in_order_and_names_counts_and_manifest_agree(tmp_path, wikitext, wikitext_tokenizer):
    output = str(tmp_path / "train")
    manifest = write_shards(
        ShardArguments(
            output=output,
            tokenizer=wikitext_tokenizer,
            corpus=str(wikitext / "test.txt"),
            records_per_shard=500,
        )
    )
    samples = read_records(output, 128)
    stream = tokenized_stream(wikitext_tokenizer, nonblank_lines(wikitext / "test.txt"))

    assert len(stream) == manifest["tokens_written"] + manifest["tokens_dropped"]
    assert manifest["tokens_dropped"] < 128
    assert np.array_equal(samples.reshape(-1), stream[: manifest["tokens_written"]])

    names = shard_names(output)
    assert names == [f["name"] for f in manifest["files"]]
    for file in manifest["files"]:
        count = int(re.search(r"-\d+-(\d+)\.tfrecord$", file["name"]).group(1))  # the reference's reader
        assert count == file["records"] == sum(1 for _ in tf.data.TFRecordDataset(str(Path(output, file["name"]))))
        assert file["bytes"] == Path(output, file["name"]).stat().st_size
    assert all(f["records"] == 500 for f in manifest["files"][:-1])
    assert manifest["num_records"] == len(samples) == sum(f["records"] for f in manifest["files"])
    assert manifest["texts"] == len(nonblank_lines(wikitext / "test.txt"))
    assert manifest == read_manifest(output)
    assert (
        manifest["split"] == "train" and manifest["max_length"] == 128 and manifest["vocab_size"] == WIKITEXT_VOCAB_SIZE
    )
    assert manifest["special_tokens"]["mask"] == 4 and manifest["special_tokens"]["pad"] == 1
    assert manifest["tokenizer_fingerprint"].startswith("sha256:")


def test_blank_lines_add_no_tokens(tmp_path, embedded_tokenizer):
    (tmp_path / "dense.txt").write_text("alpha beta\ngamma delta\n" * 200)
    (tmp_path / "sparse.txt").write_text("\n\nalpha beta\n   \n\ngamma delta\n" * 200)
    results = [
        write_shards(
            ShardArguments(
                output=str(tmp_path / name),
                tokenizer=embedded_tokenizer,
                corpus=str(tmp_path / f"{name}.txt"),
                max_length=16,
            )
        )
        for name in ("dense", "sparse")
    ]
    assert results[0]["tokens_written"] == results[1]["tokens_written"]
    assert np.array_equal(read_records(str(tmp_path / "dense"), 16), read_records(str(tmp_path / "sparse"), 16))


def part_token_streams(folder: str, max_length: int) -> list[tuple[np.ndarray, int]]:
    """(tokens written, tokens dropped) of each part of a shard set, in part order."""
    streams = []
    for uri in sorted(Path(folder, "parts").glob("*-of-*.json")):
        part = json.loads(uri.read_text())
        files = [str(Path(folder, f["name"])) for f in part["files"]]
        spec = {"input_ids": tf.io.FixedLenFeature([max_length], tf.int64)}
        tokens = [tf.io.parse_single_example(r, spec)["input_ids"].numpy() for r in tf.data.TFRecordDataset(files)]
        streams.append((np.concatenate(tokens) if tokens else np.zeros(0, np.int64), part["tokens_dropped"]))
    return streams


def assert_parts_write_the_token_stream_of_one_part(whole: str, parted: str, max_length: int) -> None:
    """The parts, one after the other, hold exactly the token stream the unsplit run holds: each part's
    tokens are the next stretch of it, after the previous part's dropped leftover."""
    (single, single_dropped), *_ = part_token_streams(whole, max_length)
    offset = 0
    for tokens, dropped in part_token_streams(parted, max_length):
        expected = single[offset : offset + len(tokens)]  # the last part may run into the unsplit run's leftover
        assert np.array_equal(tokens[: len(expected)], expected)
        assert len(expected) == len(tokens) or offset + len(tokens) <= len(single) + single_dropped
        offset += len(tokens) + dropped
    assert offset == len(single) + single_dropped  # every token once


def corpus_layouts(root: Path, lines: list[str]) -> dict[str, str]:
    root.mkdir()
    (root / "one.txt").write_text("\n".join(lines) + "\n")
    for index in range(16):
        chunk = lines[index * len(lines) // 16 : (index + 1) * len(lines) // 16]
        (root / f"many-{index:02d}.txt").write_text("\n".join(chunk) + "\n")
    pq.write_table(pa.table({"text": lines}), root / "rows.parquet", row_group_size=len(lines) // 12)
    return {
        "one file": str(root / "one.txt"),
        "16 files": str(root / "many-*.txt"),
        "parquet": str(root / "rows.parquet"),
    }


@pytest.mark.parametrize("layout", ["one file", "16 files", "parquet"])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_parts_read_their_share_and_together_write_the_token_stream_of_one_part(tmp_path, embedded_tokenizer, layout):
    lines = [line for line in embedded_lines() if line.strip()]
    corpus = corpus_layouts(tmp_path / "corpus", lines)[layout]
    whole = write_shards(ShardArguments(output=str(tmp_path / "whole"), tokenizer=embedded_tokenizer, corpus=corpus))
    parted = str(tmp_path / "parts")
    manifests = [
        write_shards(ShardArguments(output=parted, tokenizer=embedded_tokenizer, corpus=corpus, num_parts=3, part=k))
        for k in (2, 0, 1)
    ]
    merged = merge_manifests(parted)
    assert merged["texts"] == whole["texts"] == len(lines)
    assert_parts_write_the_token_stream_of_one_part(str(tmp_path / "whole"), parted, 128)
    if layout != "parquet":  # each part read about a third of the bytes, and together the corpus once
        assert all(m["bytes_read"] < 0.45 * whole["bytes_read"] for m in manifests)
        assert whole["bytes_read"] <= merged["bytes_read"] <= whole["bytes_read"] + 3 * (LINE_STEP + 2000)


def test_merge_refuses_missing_or_mismatched_parts(tmp_path, embedded_tokenizer):
    output = str(tmp_path / "s")
    write_shards(ShardArguments(output=output, tokenizer=embedded_tokenizer, num_parts=3, part=0))
    with pytest.raises(InvalidParameter, match=r"is missing parts \[1, 2\] of 3"):
        merge_manifests(output)
    write_shards(ShardArguments(output=output, tokenizer=embedded_tokenizer, num_parts=3, part=1, max_length=64))
    with pytest.raises(InvalidParameter, match=r"different settings: .*max_length"):
        merge_manifests(output)
    assert not Path(output, MANIFEST).exists()


def test_holdout_splits_never_share_a_text(tmp_path, embedded_tokenizer):
    common = {"tokenizer": embedded_tokenizer, "holdout_fraction": 0.1, "max_length": 32}
    train = write_shards(ShardArguments(output=str(tmp_path / "train"), **common))
    valid = write_shards(ShardArguments(output=str(tmp_path / "valid"), split="validation", holdout="only", **common))
    all_texts = write_shards(ShardArguments(output=str(tmp_path / "all"), tokenizer=embedded_tokenizer, max_length=32))
    assert train["texts"] + valid["texts"] == all_texts["texts"]
    assert 0.05 < valid["texts"] / all_texts["texts"] < 0.15
    assert shard_names(str(tmp_path / "valid"))[0].startswith("validation-00000-00000-")
    assert valid["holdout"] == "only" and train["holdout"] == "exclude"


def test_rerun_is_idempotent_and_other_settings_need_overwrite(tmp_path, embedded_tokenizer):
    output = str(tmp_path / "s")
    first = write_shards(ShardArguments(output=output, tokenizer=embedded_tokenizer))
    mtimes = {p.name: p.stat().st_mtime_ns for p in Path(output).glob("*.tfrecord")}
    assert write_shards(ShardArguments(output=output, tokenizer=embedded_tokenizer)) == first
    assert {p.name: p.stat().st_mtime_ns for p in Path(output).glob("*.tfrecord")} == mtimes
    with pytest.raises(InvalidParameter, match=r"--output=.*other settings \(features, max_length\).*--overwrite"):
        write_shards(ShardArguments(output=output, tokenizer=embedded_tokenizer, max_length=64))
    second = write_shards(ShardArguments(output=output, tokenizer=embedded_tokenizer, max_length=64, overwrite=True))
    assert second["max_length"] == 64
    assert shard_names(output) == [f["name"] for f in second["files"]]
    assert len(read_records(output, 64)) == second["num_records"]


# Where the crash suite kills the shards job: (function, only calls with an argument containing, n-th such
# call, kill after the call returns rather than before).
# Where the crash suite kills a job: (function, only calls with an argument containing, n-th such call,
# kill after the call returns rather than before).
KILL_POINTS = {
    "tokenizing, nothing written yet": ("components.shards:SamplePacker.add", "", 1, False),
    "records in an open temporary shard": ("components.shards:serialize_examples", "", 3, False),
    "a shard closed, not yet renamed": ("components.lib.storage:publish", ".tfrecord", 1, False),
    "three shards published": ("components.lib.storage:publish", ".tfrecord", 3, True),
    "part manifest written, not renamed": ("components.lib.storage:publish", "parts/", 1, False),
    "part manifest published, no manifest": ("components.lib.storage:publish", "parts/", 1, True),
    "manifest written, not renamed": ("components.lib.storage:publish", "manifest.json", 1, False),
    "manifest published": ("components.lib.storage:publish", "manifest.json", 1, True),
}
MERGE_KILL_POINTS = {
    "a shard copied, not yet renamed": ("components.lib.storage:publish", ".tfrecord", 2, False),
    "the first part's manifest copied": ("components.lib.storage:publish", "parts/", 1, True),
    "manifest written, not renamed": ("components.lib.storage:publish", "manifest.json", 1, False),
}


def folder_contents(root: str) -> dict[str, bytes]:
    """Every file under ``root`` (local or gs://) by relative name, read through the project's storage."""
    from components.lib import storage

    contents = {}
    for directory, _, names in tf.io.gfile.walk(root):
        for name in names:
            uri = storage.join(directory, name)
            contents[uri[len(root) :].lstrip("/")] = storage.read_bytes(uri)
    return contents


@pytest.fixture(scope="module")
def crash_reference(tmp_path_factory, wikitext, wikitext_tokenizer) -> tuple[list[str], dict[str, bytes]]:
    """The shards job (module and arguments but --output) and what an uninterrupted run of it writes."""
    job = ["components.shards", "--tokenizer", wikitext_tokenizer, "--corpus", str(wikitext / "valid.txt")]
    job += ["--records_per_shard", "300", "--batch_size", "200"]
    output = str(tmp_path_factory.mktemp("crash-reference"))
    result = run_module(*job, "--output", output)
    assert result.returncode == 0, result.stderr
    return job, folder_contents(output)


@pytest.fixture(scope="module")
def merge_reference(tmp_path_factory, embedded_tokenizer) -> tuple[list[str], dict[str, bytes]]:
    """The merge job over three parts written to folders of their own, as the pipeline's tasks write them,
    and what an uninterrupted merge writes."""
    root = tmp_path_factory.mktemp("merge-reference")
    folders = [str(root / f"task-{part}") for part in range(3)]
    for part, folder in enumerate(folders):
        write_shards(
            ShardArguments(output=folder, tokenizer=embedded_tokenizer, num_parts=3, part=part, records_per_shard=100)
        )
    job = ["components.merge_shards", "--parts", ",".join(folders)]
    result = run_module(*job, "--output", str(root / "merged"))
    assert result.returncode == 0, result.stderr
    return job, folder_contents(str(root / "merged"))


def run_killed(kill_point: tuple[str, str, int, bool], job: list[str], output: str) -> None:
    function, matching, nth, after = kill_point
    kill = ["--function", function, "--matching", matching, "--nth", str(nth), *(["--after"] if after else [])]
    process = run_at(kill, *job, "--output", output)
    assert process.returncode == -signal.SIGKILL, f"not killed at {kill_point}: {process.stderr[-2000:]}"


def assert_killed_run_then_rerun_match(kill_point: tuple, reference_run, output: str) -> None:
    job, reference = reference_run
    run_killed(kill_point, job, output)

    visible = {name: data for name, data in folder_contents(output).items() if not name.endswith(".partial")}
    for name, data in visible.items():  # a reader sees only complete files, each as an uninterrupted run wrote it
        assert data == reference[name], f"{name} is visible but incomplete after a kill at {kill_point}"
    if MANIFEST not in visible:
        with pytest.raises(InvalidParameter, match=r"holds no finished shard set"):
            read_manifest(output)

    rerun = run_module(*job, "--output", output)
    assert rerun.returncode == 0, rerun.stderr
    assert folder_contents(output) == reference  # same names, counts (in the names and manifest) and bytes


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_shards_job_killed_anywhere_shows_no_partial_file_and_its_rerun_equals_an_uninterrupted_run(
    tmp_path, crash_reference, point
):
    assert_killed_run_then_rerun_match(KILL_POINTS[point], crash_reference, str(tmp_path / "shards"))


@pytest.mark.slow
@pytest.mark.parametrize("point", list(MERGE_KILL_POINTS))
def test_a_merge_killed_anywhere_shows_no_partial_file_and_its_rerun_equals_an_uninterrupted_merge(
    tmp_path, merge_reference, point
):
    assert_killed_run_then_rerun_match(MERGE_KILL_POINTS[point], merge_reference, str(tmp_path / "merged"))


@pytest.mark.slow
@pytest.mark.parametrize("point", ["a shard closed, not yet renamed", "manifest written, not renamed"])
def test_the_same_on_gs(gcs, crash_reference, point):
    assert_killed_run_then_rerun_match(KILL_POINTS[point], crash_reference, f"{gcs}/shards")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"max_length": 0}, r"--max-length=0: must be from 8 to 8192"),
        ({"max_length": 100_000}, r"--max-length=100000: must be from 8 to 8192"),
        ({"records_per_shard": 0}, r"--records-per-shard=0"),
        ({"num_parts": 2, "part": 2}, r"--part=2: must be from 0 to num_parts-1 = 1"),
        ({"holdout_fraction": 1.0}, r"--holdout-fraction=1.0"),
        ({"holdout": "only"}, r"--holdout='only': 'only' needs a --holdout_fraction"),
        ({"split": "train/x"}, r"--split='train/x'"),
        ({"output": "s3://bucket/shards"}, r"--output='s3://bucket/shards': unsupported URI scheme 's3'"),
        ({"corpus": "/no/such/*.txt"}, r"--corpus='/no/such/\*.txt': no file matches"),
        ({"text_column": "body", "corpus": "JSONL"}, r"--text-column='body'.*has no such column.*\['text'\]"),
        ({"corpus": "EMPTY"}, r"--corpus=.*holds no text"),
        ({"tokenizer": "/no/such/tokenizer"}, r"--tokenizer='/no/such/tokenizer': is not a tokenizer folder"),
        ({"corpus": "TINY", "max_length": 512}, r"--max-length=512: the corpus gave \d+ tokens, less than one"),
    ],
)
def test_bad_input_fails_fast_naming_the_parameter_and_writes_nothing(tmp_path, embedded_tokenizer, arguments, message):
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "tiny.txt").write_text("a few words\n")
    (tmp_path / "rows.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    named = {"EMPTY": tmp_path / "empty.txt", "TINY": tmp_path / "tiny.txt", "JSONL": tmp_path / "rows.jsonl"}
    if arguments.get("corpus") in named:
        arguments = {**arguments, "corpus": str(named[arguments["corpus"]])}
    output = tmp_path / "out"
    with pytest.raises(InvalidParameter, match=message):
        write_shards(ShardArguments(**{"output": str(output), "tokenizer": embedded_tokenizer, **arguments}))
    assert not output.exists() or not list(output.rglob("*.*"))


def test_cli_reports_bad_input_in_one_line_with_exit_code_2(tmp_path, embedded_tokenizer):
    result = run_module(
        "components.shards", "--tokenizer", embedded_tokenizer, "--output", str(tmp_path / "o"), "--max_length", "4"
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: --max-length=4: must be from 8 to 8192 tokens"
    assert not (tmp_path / "o").exists()


def test_merge_refuses_a_part_whose_shard_is_missing_or_truncated(tmp_path, embedded_tokenizer):
    output = tmp_path / "s"
    for part in range(2):
        write_shards(ShardArguments(output=str(output), tokenizer=embedded_tokenizer, num_parts=2, part=part))
    shard = sorted(output.glob("train-00001-*.tfrecord"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(InvalidParameter, match=rf"shard {shard.name} has 100 bytes, its part manifest says"):
        merge_manifests(str(output))
    shard.unlink()
    with pytest.raises(InvalidParameter, match=rf"shard {shard.name} listed in its part manifest is missing"):
        merge_manifests(str(output))
    assert not (output / MANIFEST).exists()
