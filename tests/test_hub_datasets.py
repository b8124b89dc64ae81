"""``hf:`` corpora through the real ``datasets`` client, streamed from the local Hub stand-in (``HF_ENDPOINT``):
a dataset repository laid out as ``wikitext`` is on the Hub today (parquet files under a config folder, the
configs declared in the README's YAML)."""

import io
import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import LONG_TEST_SECONDS, run_module
from test_gcs import bucket_objects
from test_shards import assert_parts_write_the_token_stream_of_one_part

from components.lib import storage
from components.lib.corpus import embedded_lines

DATASET = "user/wikitext-mini"
CORPUS = f"hf:{DATASET}:wikitext-103-raw-v1"
README = b"""---
configs:
- config_name: wikitext-103-raw-v1
  data_files:
  - split: train
    path: wikitext-103-raw-v1/train-*
  - split: validation
    path: wikitext-103-raw-v1/validation-*
---
# A small slice of text, laid out as wikitext is on the Hub
"""


def parquet(texts: list[str], row_groups: int) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buffer, row_group_size=-(-len(texts) // row_groups))
    return buffer.getvalue()


@pytest.fixture
def hub_dataset(hub, tmp_path):
    """The Hub stand-in holding the public dataset (two train files of four row groups each, one validation
    file) and a private copy; ``hub.env`` with a cache of the test's own."""
    lines = embedded_lines()
    half = len(lines) // 2
    files = {
        "README.md": README,
        "wikitext-103-raw-v1/train-00000-of-00002.parquet": parquet(lines[:half], 4),
        "wikitext-103-raw-v1/train-00001-of-00002.parquet": parquet(lines[half:-400], 4),
        "wikitext-103-raw-v1/validation-00000-of-00001.parquet": parquet(lines[-400:], 1),
    }
    hub.add_dataset(DATASET, files)
    hub.add_dataset("user/private-text", files, private=True)
    hub.env = {**hub.env, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    hub.train_lines = [line for line in lines[:-400] if line.strip()]
    return hub


def job(hub, name: str, *arguments: str, token: bool = True) -> subprocess.CompletedProcess:
    env = dict(hub.env) if token else {key: value for key, value in hub.env.items() if key != "HF_TOKEN"}
    return run_module("pipelines.cli", name, *arguments, env=env)


@pytest.mark.slow  # 24 s: out of the fast tier (make test-fast under 3 minutes)
def test_tokenizer_and_shards_stream_a_hub_dataset_in_one_and_three_parts(tmp_path, hub_dataset):
    hub = hub_dataset
    tokenizer = str(tmp_path / "tokenizer")
    trained = job(hub, "tokenizer", "--corpus", CORPUS, "--vocab_size", "2000", "--output", tokenizer)
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads(Path(tokenizer, "tokenizer_summary.json").read_text())
    assert summary["texts_read"] == len(hub.train_lines) and summary["sampled"] is True

    whole = job(hub, "shards", "--corpus", CORPUS, "--tokenizer", tokenizer, "--output", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    parted = str(tmp_path / "parts")
    for part in range(3):  # two files, fewer than the parts: split by row groups
        run = job(
            hub, "shards", "--corpus", CORPUS, "--tokenizer", tokenizer, "--output", parted, "--num_parts", "3",
            "--part", str(part),
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        assert "reads its share of 8 dataset shards" in run.stderr
    merged = job(hub, "merge-shards", "--output", parted)
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert json.loads(Path(parted, "manifest.json").read_text())["texts"] == len(hub.train_lines)
    assert_parts_write_the_token_stream_of_one_part(str(tmp_path / "whole"), parted, 128)


@pytest.mark.slow  # a datasets load against the stand-in each: out of the fast tier (make test-fast under 3 minutes)
@pytest.mark.parametrize(
    "corpus, extra, message",
    [
        ("hf:user/no-such-dataset", [], "--corpus='hf:user/no-such-dataset': cannot load the Hub dataset: "),
        (f"hf:{DATASET}:no-such-config", [], f"--corpus='hf:{DATASET}:no-such-config': cannot load the Hub dataset: "),
        (f"{CORPUS}:test", [], f"--corpus='{CORPUS}:test': cannot load the Hub dataset: "),
        (CORPUS, ["--text_column", "body"], "--text-column='body': " + CORPUS + " has no such column; it has ['text']"),
    ],
    ids=["unknown dataset", "unknown config", "a split it does not have", "a column it does not have"],
)
def test_a_hub_dataset_that_cannot_be_read_fails_in_one_line_and_writes_nothing(
    tmp_path, hub_dataset, embedded_tokenizer, corpus, extra, message
):
    for name, arguments in (
        ("tokenizer", ["--output", str(tmp_path / "out")]),
        ("shards", ["--tokenizer", embedded_tokenizer, "--output", str(tmp_path / "out")]),
    ):
        run = job(hub_dataset, name, "--corpus", corpus, *extra, *arguments)
        assert run.returncode == 2, run.stderr[-3000:]
        assert "Traceback" not in run.stderr
        assert run.stderr.strip().splitlines()[-1].startswith("error: " + message), run.stderr[-1000:]
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_private_hub_dataset_needs_the_token(tmp_path, hub_dataset):
    corpus = "hf:user/private-text:wikitext-103-raw-v1"
    output = str(tmp_path / "tokenizer")
    refused = job(hub_dataset, "tokenizer", "--corpus", corpus, "--output", output, token=False)
    assert refused.returncode == 2 and f"--corpus='{corpus}': cannot load the Hub dataset" in refused.stderr
    read = job(hub_dataset, "tokenizer", "--corpus", corpus, "--vocab_size", "2000", "--output", output)
    assert read.returncode == 0, read.stderr[-3000:]


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow  # one whole pipeline that asserts what three would (CI's time: docs/testing.md)
def test_the_whole_pipeline_on_a_hub_dataset_keeps_its_data_in_a_bucket_trains_eight_replicas_and_pushes(
    tmp_path, hub_dataset, gcs, monkeypatch
):
    """A Hub dataset (in one part: a Hub dataset's parts are the test above's, a pipeline's the local one's), every
    artifact and checkpoint on gs:// (object permissions only), the training on 8 CPU replicas as on a v3-8, and
    the push to the Hub: what a user's first Vertex AI run does."""
    from pipelines.run_local import RunLocalArguments, run_local

    hub = hub_dataset
    for name in ("HF_ENDPOINT", "HF_HUB_DISABLE_XET", "HF_TOKEN", "HF_HOME"):  # what the steps' processes see
        monkeypatch.setenv(name, hub.env[name])
    summary = run_local(
        RunLocalArguments(
            pipeline_root=str(tmp_path / "runs"),
            output_root=storage.join(gcs, "runs"),
            corpus=CORPUS,
            vocab_size=2000,
            replicas=8,
            per_replica_batch_size=4,
            max_steps=8,
            hub_repo_id="user/gs-run",
        )
    )
    artifacts = summary["artifacts"]
    for name in ("tokenizer", "validation shards", "train shards", "model", "evaluation"):
        assert artifacts[name].startswith(gcs + "/runs/run-"), name
    manifest = json.loads(bucket_objects(artifacts["train shards"])["manifest.json"])
    assert manifest["corpus"]["source"] == CORPUS and manifest["num_parts"] == 1
    model = bucket_objects(artifacts["model"])
    assert {"config.json", "tf_model.h5", "tokenizer.json", "training_summary.json"} <= model.keys()
    training = json.loads(model["training_summary.json"])
    assert training["replicas"] == 8 and training["global_batch_size"] == 32 and training["total_steps"] == 8
    # the checkpoints are the run's, under output_root, where every attempt of the train task finds them
    assert not any(name.startswith("checkpoints/") for name in model)
    checkpoint_dir = training["arguments"]["checkpoint_dir"]
    assert checkpoint_dir.startswith(gcs + "/runs/run-") and "/checkpoints/" in checkpoint_dir
    assert any(name.endswith("ckpt-8.index") for name in bucket_objects(checkpoint_dir))
    metrics = json.loads(bucket_objects(artifacts["evaluation"])["metrics.json"])
    assert summary["metrics"]["loss"] == metrics["loss"] and metrics["masked_tokens"] > 0
    assert not list((tmp_path / "runs").rglob("*.tfrecord")) and not list((tmp_path / "runs").rglob("*.h5"))
    assert hub.file("user/gs-run", "tf_model.h5") == model["tf_model.h5"]
    assert len(hub.repos["user/gs-run"].commits) == 1
