"""``hf:`` corpora through the real ``datasets`` client, streamed from the local Hub stand-in (``HF_ENDPOINT``):
a dataset repository laid out as ``wikitext`` is on the Hub today (parquet files under a config folder, the
configs declared in the README's YAML)."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
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
    return parquet_table({"text": texts}, row_groups)


def parquet_table(columns: dict[str, list], row_groups: int = 1) -> bytes:
    buffer = io.BytesIO()
    rows = len(next(iter(columns.values())))
    pq.write_table(pa.table(columns), buffer, row_group_size=-(-rows // row_groups))
    return buffer.getvalue()


def configs_readme(splits: dict[str, tuple[str, ...]]) -> bytes:
    """A dataset card whose YAML declares each config's splits, as GLUE's on the Hub does."""
    lines = ["---", "configs:"]
    for config, names in splits.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        lines += [f"  - split: {name}\n    path: {config}/{name}-*" for name in names]
    return ("\n".join([*lines, "---", "# labelled text laid out as GLUE is on the Hub", ""])).encode()


def add_labelled_datasets(hub) -> None:
    """GLUE's layout with three of its tasks (SST-2, single sentences; MRPC, pairs; MNLI, three classes scored on two
    splits; test splits unlabelled: -1, as GLUE's are), and a dataset of another layout (text labels, its held-out
    split named ``dev``), made of real sentences: the embedded corpus's prose lines."""
    lines = [line.strip() for line in embedded_lines() if len(line.split()) > 6][:240]

    def sst2(rows: range, labelled: bool = True) -> bytes:
        labels = [len(lines[i]) % 2 if labelled else -1 for i in rows]
        return parquet_table({"sentence": [lines[i] for i in rows], "label": labels, "idx": list(rows)})

    def mrpc(rows: range, labelled: bool = True) -> bytes:
        labels = [i % 2 if labelled else -1 for i in rows]
        first, second = [lines[i] for i in rows], [lines[i + 1] for i in rows]
        return parquet_table({"sentence1": first, "sentence2": second, "label": labels, "idx": list(rows)})

    def mnli(rows: range) -> bytes:
        first, second = [lines[i] for i in rows], [lines[i + 2] for i in rows]
        return parquet_table({"premise": first, "hypothesis": second, "label": [i % 3 for i in rows]})

    glue_splits = ("train", "validation", "test")
    mnli_splits = ("train", "validation_matched", "validation_mismatched")
    hub.add_dataset(
        "nyu-mll/glue",
        {
            "README.md": configs_readme({"sst2": glue_splits, "mrpc": glue_splits, "mnli": mnli_splits}),
            "mnli/train-00000-of-00001.parquet": mnli(range(0, 60)),
            "mnli/validation_matched-00000-of-00001.parquet": mnli(range(60, 90)),
            "mnli/validation_mismatched-00000-of-00001.parquet": mnli(range(90, 111)),
            "sst2/train-00000-of-00001.parquet": sst2(range(0, 96)),
            "sst2/validation-00000-of-00001.parquet": sst2(range(96, 128)),
            "sst2/test-00000-of-00001.parquet": sst2(range(128, 160), labelled=False),
            "mrpc/train-00000-of-00001.parquet": mrpc(range(0, 96)),
            "mrpc/validation-00000-of-00001.parquet": mrpc(range(96, 128)),
            "mrpc/test-00000-of-00001.parquet": mrpc(range(128, 160), labelled=False),
        },
    )
    reviews = {"review": lines[160:240], "stars": ["good" if i % 3 else "bad" for i in range(80)]}
    hub.add_dataset(
        "user/reviews",
        {
            "README.md": configs_readme({"default": ("train", "dev")}),
            "default/train-00000-of-00001.parquet": parquet_table({k: v[:60] for k, v in reviews.items()}),
            "default/dev-00000-of-00001.parquet": parquet_table({k: v[60:] for k, v in reviews.items()}),
        },
    )


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
    add_labelled_datasets(hub)
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


LOAD_TASKS = """
import json, sys
from components.lib.downstream_tasks import parse_tasks
from components.lib.errors import InvalidParameter

loaded = []
for source, columns, label in json.loads(sys.argv[1]):
    try:
        task = parse_tasks(source, columns, label)[0].load()
        loaded.append({
            "metric": task.metric, "labels": list(task.label_names), "validation_split": task.validation_split,
            "train": [task.train.texts[0], len(task.train.labels)],
            "validation": [task.validation.labels[:3], len(task.validation.labels)],
            "also_scored": {split: len(examples.labels) for split, examples in task.also_scored.items()},
        })
    except InvalidParameter as error:
        loaded.append({"refused": str(error)})
print(json.dumps(loaded))
"""


@pytest.mark.slow  # a datasets load against the stand-in each
def test_downstream_tasks_load_from_the_hub_by_glue_s_conventions_or_named_columns_and_splits(hub_dataset):
    """The probe's Hub tasks through the real ``datasets`` client: GLUE's single-sentence and pair tasks with their
    columns, metric and validation split (never the unlabelled test split; MNLI's matched and mismatched), another
    dataset's columns and its own held-out split, and what cannot be loaded refused in one line naming the task."""
    specs = [
        ("hf:nyu-mll/glue:sst2", "", "label"),
        ("hf:nyu-mll/glue:mrpc", "", "label"),
        ("hf:nyu-mll/glue:mnli", "", "label"),
        ("hf:nyu-mll/glue:mnli:validation_mismatched", "", "label"),
        ("hf:user/reviews:default:dev", "review", "stars"),
        ("hf:user/reviews", "review", "stars"),  # no validation split
        ("hf:user/reviews:default:dev", "review", "rating"),
        ("hf:nyu-mll/glue:no-such-task", "sentence", "label"),
        ("hf:user/no-such-dataset", "text", "label"),
    ]
    done = subprocess.run(
        [sys.executable, "-c", LOAD_TASKS, json.dumps(specs)], capture_output=True, text=True, env=hub_dataset.env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sst2, mrpc, mnli, mismatched, reviews, *refused = json.loads(done.stdout.strip().splitlines()[-1])
    assert sst2["metric"] == "accuracy" and sst2["validation_split"] == "validation" and sst2["labels"] == ["0", "1"]
    assert len(sst2["train"][0]) == 1 and sst2["train"][1] == 96 and sst2["validation"][1] == 32
    assert mrpc["metric"] == "f1" and len(mrpc["train"][0]) == 2 and mrpc["validation"] == [[0, 1, 0], 32]
    # MNLI: fine-tuned once, scored on matched (its reported split) and mismatched; or on the one split named
    assert mnli["validation_split"] == "validation_matched" and mnli["validation"] == [[0, 1, 2], 30]
    assert mnli["also_scored"] == {"validation_mismatched": 21} and mnli["labels"] == ["0", "1", "2"]
    assert mismatched["validation_split"] == "validation_mismatched" and mismatched["also_scored"] == {}
    assert reviews["validation_split"] == "dev" and reviews["labels"] == ["bad", "good"]
    assert reviews["train"][1] == 60 and reviews["validation"][1] == 20
    messages = [result["refused"] for result in refused]
    assert messages[0].startswith("--tasks='hf:user/reviews': has no 'validation' split (its splits: ['train', 'dev'])")
    assert messages[1].startswith("--tasks='hf:user/reviews:default:dev': its train split has no column 'rating'")
    assert messages[2].startswith("--tasks='hf:nyu-mll/glue:no-such-task': cannot be loaded: ")
    assert messages[3].startswith("--tasks='hf:user/no-such-dataset': cannot be loaded: ")
    assert all("\n" not in message for message in messages)


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow  # one whole pipeline that asserts what three would (CI's time: docs/testing.md)
def test_the_whole_pipeline_on_a_hub_dataset_keeps_its_data_in_a_bucket_trains_four_replicas_and_pushes(
    tmp_path, hub_dataset, gcs, monkeypatch
):
    """A Hub dataset (in one part: a Hub dataset's parts are the test above's, a pipeline's the local one's), every
    artifact and checkpoint on gs:// (object permissions only), the training on 4 CPU replicas (MirroredStrategy: 8,
    as many as a v3-8's, take twice as long here on the same path), and the push to the Hub: what a user's first
    Vertex AI run does."""
    from pipelines.clean import CleanArguments, clean
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
            replicas=4,
            per_replica_batch_size=8,
            max_steps=8,
            hub_repo_id="user/gs-run",
            # the probe on GLUE's MRPC and MNLI from the stand-in, loaded by preflight first; a short budget, and a
            # grid of two rates (make run's probe has one) whose choice carves a development split in the pipeline
            downstream_tasks="hf:nyu-mll/glue:mrpc,hf:nyu-mll/glue:mnli",
            downstream_max_steps=3,
            downstream_learning_rates="3e-4,3e-3",
            downstream_seeds="1",
        )
    )
    artifacts, run = summary["artifacts"], Path(summary["run"]).name
    for name in ("tokenizer", "validation shards", "train shards", "model", "evaluation"):
        assert artifacts[name].startswith(f"{gcs}/runs/{run}/"), name  # in the run's own folder there
    manifest = json.loads(bucket_objects(artifacts["train shards"])["manifest.json"])
    assert manifest["corpus"]["source"] == CORPUS and manifest["num_parts"] == 1
    model = bucket_objects(artifacts["model"])
    assert {"config.json", "tf_model.h5", "tokenizer.json", "training_summary.json"} <= model.keys()
    training = json.loads(model["training_summary.json"])
    assert training["replicas"] == 4 and training["global_batch_size"] == 32 and training["total_steps"] == 8
    # the checkpoints are the run's, under output_root, where every attempt of the train task finds them
    assert not any(name.startswith("checkpoints/") for name in model)
    checkpoint_dir = training["arguments"]["checkpoint_dir"]
    assert checkpoint_dir == f"{gcs}/runs/checkpoints/{run}"
    assert any(name.endswith("ckpt-8.index") for name in bucket_objects(checkpoint_dir))
    # the TensorBoard logs beside every run's, by the run's name: tensorboard --logdir ROOT/tensorboard compares runs
    tensorboard_dir = training["arguments"]["tensorboard_dir"]
    assert tensorboard_dir == checkpoint_dir.replace("/checkpoints/", "/tensorboard/")
    assert any("tfevents" in name for name in bucket_objects(tensorboard_dir))
    metrics = json.loads(bucket_objects(artifacts["evaluation"])["metrics.json"])
    assert summary["metrics"]["loss"] == metrics["loss"] and metrics["masked_tokens"] > 0
    assert not list((tmp_path / "runs").rglob("*.tfrecord")) and not list((tmp_path / "runs").rglob("*.h5"))
    assert hub.file("user/gs-run", "tf_model.h5") == model["tf_model.h5"]
    assert len(hub.repos["user/gs-run"].commits) == 1
    assert artifacts["downstream probe"].startswith(f"{gcs}/runs/{run}/")
    probe = json.loads(bucket_objects(artifacts["downstream probe"])["downstream.json"])
    mrpc, matched, mismatched = probe["tasks"]
    assert mrpc["task"] == "hf:nyu-mll/glue:mrpc" and mrpc["metric"] == "f1"
    assert mrpc["train_samples"] + mrpc["dev_samples"] == 96 and mrpc["dev_samples"] == round(0.2 * 96)
    # MNLI's fine-tunings scored on both its validation splits: the same runs, two rows; one task in the average
    assert [matched["validation_split"], mismatched["validation_split"]] == [
        "validation_matched",
        "validation_mismatched",
    ]
    assert (matched["validation_samples"], mismatched["validation_samples"]) == (30, 21)
    for probed in ("pre-trained", "random init"):
        steps = [run["steps"] for run in matched[probed]["runs"]]
        assert steps == [run["steps"] for run in mismatched[probed]["runs"]]
        assert matched[probed]["learning_rate"] == mismatched[probed]["learning_rate"]
        mnli = (matched[probed]["score"] + mismatched[probed]["score"]) / 2
        assert probe["average"][probed] == pytest.approx((mrpc[probed]["score"] + mnli) / 2)
    assert mrpc["pre-trained"]["runs"][0]["steps"] == 3 and mrpc["validation_split"] == "validation"
    card = hub.file("user/gs-run", "README.md").decode()
    front = yaml.safe_load(card.split("---\n")[1])
    if mrpc["pre-trained"]["signal"]:
        (indexed,) = [row for row in front["model-index"][0]["results"] if row["dataset"]["config"] == "mrpc"]
        assert indexed["dataset"] == {
            "name": "glue mrpc",
            "type": "nyu-mll/glue",
            "config": "mrpc",
            "split": "validation",
            "args": {"scored_samples": mrpc["validation_samples"]},
        }
        assert indexed["metrics"][0] == {
            "type": "f1",
            "value": round(mrpc["pre-trained"]["score"], 4),
            "name": "f1 (short fine-tune, 1 seed(s))",
        }
        assert indexed["source"]["url"] == "https://huggingface.co/user/gs-run"
    else:  # 3 steps may learn nothing: then no score of the model's on the Hub, and the card says so
        indexed_configs = [
            row["dataset"]["config"] for row in front.get("model-index", [{"results": []}])[0]["results"]
        ]
        assert "mrpc" not in indexed_configs and "no signal" in card
    # clean finds the run's data in the bucket from the record run-local left, deletes it and the checkpoints, and
    # keeps the model
    cleaned = clean(CleanArguments(run=run, pipeline_root=str(tmp_path / "runs"), yes=True))
    assert cleaned["delete_objects"] > 0 and not bucket_objects(checkpoint_dir)
    assert not bucket_objects(artifacts["train shards"]) and not bucket_objects(artifacts["tokenizer"])
    left = bucket_objects(f"{gcs}/runs/{run}")  # no shard of any part left, the loop's among them
    assert left and not [name for name in left if name.endswith(".tfrecord")]
    assert bucket_objects(artifacts["model"]).keys() == model.keys()
