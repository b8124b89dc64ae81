import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import HUB_TOKEN, made_once, run_module, train_tiny
from huggingface_hub import snapshot_download
from pytorch_env import pytorch_python, run_pytorch
from transformers import TFAutoModelForMaskedLM

from components.evaluate import EvaluateArguments, evaluate
from components.lib.errors import InvalidParameter
from components.lib.hub import check_repo_id, check_secret_name
from components.lib.model_card import CARD_HYPERPARAMETERS, USAGE_HEADING, model_card
from components.lib.pytorch_weights import TF_LOADING
from components.push import PushArguments
from pipelines.pipeline import compile_pipeline


@pytest.fixture(scope="module")
def model_and_evaluation(tmp_path_factory, wikitext_shards):
    def make(root: Path) -> None:  # once per test run: the tests read them, and copy what they change
        train_tiny(root / "model", wikitext_shards, max_steps=10)
        model, shards = str(root / "model"), wikitext_shards["validation"]
        evaluate(EvaluateArguments(model=model, shards=shards, output=str(root / "eval"), max_batches=2))

    root = made_once(tmp_path_factory, "push", make)
    return str(root / "model"), str(root / "eval")


def push(hub, model, evaluation, *extra, env=None):
    return run_module("components.push", "--model", model, "--evaluation", evaluation, *extra, env=env or hub.env)


@pytest.mark.slow
def test_push_uploads_model_tokenizer_and_card_in_one_commit_and_loads_back(tmp_path, hub, model_and_evaluation):
    model, evaluation = model_and_evaluation
    result = push(hub, model, evaluation, "--repo_id", "user/tiny-roberta", "--private")
    assert result.returncode == 0, result.stderr
    assert HUB_TOKEN not in result.stdout + result.stderr
    repo = hub.repos["user/tiny-roberta"]
    assert repo.private and len(repo.commits) == 1
    expected = {
        "README.md",
        "config.json",
        "model.safetensors",
        "tf_model.h5",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert expected <= set(repo.files)
    assert not any(name.startswith(("checkpoints", "logs")) for name in repo.files)

    card = hub.file("user/tiny-roberta", "README.md").decode()
    metrics = json.loads(Path(evaluation, "metrics.json").read_text())
    assert f"| perplexity | {metrics['perplexity']:.2f} |" in card
    assert "| recipe | roberta-2019-mask-decay-clip |" in card and "| learning_rate | 0.0005 |" in card  # the default's
    assert "| mlm_probability | 0.3 |" in card and "| final_mlm_probability | 0.15 |" in card
    corpus_line = next(line for line in card.splitlines() if line.startswith("- training corpus: "))
    assert corpus_line == "- training corpus: `valid.txt`"  # the file's name, never its folder or bucket
    assert "- samples of 128 tokens" in card
    assert "https://github.com/" not in card
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert metadata["library_name"] == "transformers" and metadata["pipeline_tag"] == "fill-mask"
    assert "license" not in metadata and "datasets" not in metadata  # none set, and a file corpus is no Hub dataset

    folder = snapshot_download("user/tiny-roberta", token=HUB_TOKEN, endpoint=hub.url, cache_dir=str(tmp_path))
    assert TFAutoModelForMaskedLM.from_pretrained(folder, **TF_LOADING).config.vocab_size == 5000
    # transformers 5 straight from the Hub (the stand-in), every weight in place
    answer = run_pytorch(
        {"model": "user/tiny-roberta", "sentences": ["The game was <mask> in 2010 ."], "top_k": 2}, hub.env
    )
    assert answer["loading"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    assert len(answer["fill_mask"][0]) == 2

    again = push(hub, model, evaluation, "--repo_id", "user/tiny-roberta", "--private")
    assert again.returncode == 0 and len(repo.commits) == 1, "unchanged content made a new commit"


PRIVATE_NAMES = ("acme-private-bucket", "customer-x", "123456789012")


@pytest.mark.slow
def test_a_push_publishes_no_bucket_project_path_or_secret(tmp_path, hub, model_and_evaluation):
    """A run as Vertex AI leaves it (its arguments naming the bucket, the project number in the pipeline root, the
    customer's folders, the TPU's address, a private checkpoint repository and a secret; a probe task of local files)
    pushed through the stand-in: no uploaded file, and no commit message, names any of them; the published summary
    keeps the run's figures and settings and lists what it left out."""
    model, evaluation = model_and_evaluation
    private = tmp_path / "acme-private-bucket" / "123456789012" / "customer-x"
    shutil.copytree(model, private / "model", ignore=shutil.ignore_patterns("checkpoints", "logs"))
    shutil.copytree(evaluation, private / "eval")
    root = "gs://acme-private-bucket/pipeline_root/123456789012/tpu-mlm-customer-x-20260101"
    summary_file = private / "model" / "training_summary.json"
    summary = json.loads(summary_file.read_text())
    summary["arguments"].update(
        tokenizer=f"{root}/tokenizer-step/tokenizer",
        train_shards=f"{root}/merge-shards-step/shards",
        eval_shards=f"{root}/merge-shards-step-2/shards",
        output=f"{root}/train-step/model",
        checkpoint_dir="gs://acme-private-bucket/checkpoints/customer-x",
        tensorboard_dir="gs://acme-private-bucket/tensorboard/customer-x",
        model_config="gs://acme-private-bucket/customer-x/configs/config.json",
        tpu="grpc://10.1.2.3:8470",
        hub_repo_id="acme/customer-x-checkpoints",
        hf_token_secret="projects/123456789012/secrets/customer-x-hub",  # a setting a later version may add
    )
    summary["corpus"]["source"] = "gs://acme-private-bucket/customer-x/corpus-*.txt,/home/acme/customer-x/more.txt"
    summary["hub_push_failures"] = [
        "Training checkpoint at step 5 of 10: pushing /tmp/customer-x/ckpt to the Hub repository "
        "acme/customer-x-checkpoints failed 5 times; the last error: 503"
    ]
    summary_file.write_text(json.dumps(summary, indent=2))
    task = "/home/acme/customer-x/labels.jsonl"
    rates = {"learning_rate": 1e-3, "learning_rate_search": []}
    scores = {"pre-trained": {"score": 0.7, **rates}, "random init": {"score": 0.5, **rates}}
    probe = {
        "tasks": [
            {"task": task, "metric": "accuracy", "labels": ["a", "b"], "train_samples": 10, "validation_samples": 4}
            | {"validation_split": "validation", "published": None, "gain": 0.2, **scores}
        ],
        "average": {"pre-trained": 0.7, "random init": 0.5},
        "arguments": {"seeds": "1", "tasks": task, "output": f"{root}/downstream-step/results"},
    }
    (private / "probe").mkdir()
    (private / "probe" / "downstream.json").write_text(json.dumps(probe))
    extra = ("--downstream", str(private / "probe"), "--repo_id", "user/public-model", "--no_private")
    result = push(hub, str(private / "model"), str(private / "eval"), *extra)
    assert result.returncode == 0, result.stderr[-2000:]

    # the same run's model folder exported to the Hub (tpu-mlm export: a train step's folder gets the push's card)
    exported = run_module(
        "components.export",
        "--model",
        str(private / "model"),
        "--output",
        "hf:user/exported",
        "--no_private",
        env=hub.env,
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    for repo_id in ("user/public-model", "user/exported"):
        repo = hub.repos[repo_id]
        assert {"README.md", "training_summary.json", "tf_model.h5", "model.safetensors"} <= set(repo.files)
        for name in repo.files:
            data = hub.file(repo_id, name)
            for word in (*PRIVATE_NAMES, "gs://", "/home/", "10.1.2.3", "secrets/"):
                assert word.encode() not in data, f"{repo_id}: {name} names {word}"
        assert not any(name in commit for commit in map(str, repo.commits) for name in PRIVATE_NAMES)

    published = json.loads(hub.file("user/public-model", "training_summary.json"))
    assert published["total_steps"] == summary["total_steps"] and published["history"] == summary["history"]
    assert published["arguments"]["learning_rate"] == summary["arguments"]["learning_rate"]
    assert published["arguments"]["model_config"] == "config.json"
    assert published["corpus"]["source"] == "corpus-*.txt,more.txt"  # the files' names, never their folders
    assert {"checkpoint_dir", "output", "tokenizer", "tpu", "hub_repo_id", "hf_token_secret"} <= set(
        published["left_out"]
    )
    assert published["hub_push_failures"] == ["Training checkpoint at step 5 of 10"]
    card = hub.file("user/public-model", "README.md").decode()
    assert "| `labels.jsonl` | accuracy | 0.7000 | 0.5000 |" in card
    assert json.loads(summary_file.read_text()) == summary  # the run's own folder keeps its record


@pytest.mark.slow
def test_the_model_card_s_code_runs_as_it_is_against_the_hub(hub, model_and_evaluation):
    """Each block of the card's usage section, copied as a user would: PyTorch ones under transformers 5, the TF
    one here (transformers 4.57); all read the pushed repository from the Hub stand-in."""
    model, evaluation = model_and_evaluation
    assert push(hub, model, evaluation, "--repo_id", "user/card").returncode == 0
    card = hub.file("user/card", "README.md").decode()
    usage = card.split(USAGE_HEADING)[1]
    blocks = re.findall(r"```python\n(.*?)```", usage, flags=re.DOTALL)
    assert len(blocks) == 3
    pytorch_fill, embeddings, tf_fill = blocks
    assert "'token_str'" in ran_output(pytorch_fill, pytorch_python(), hub.env)
    assert "torch.Size([2, 64])" in ran_output(embeddings, pytorch_python(), hub.env)
    assert "'token_str'" in ran_output(tf_fill, sys.executable, hub.env)


def ran_output(code: str, python, env: dict) -> str:
    ran = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stdout


@pytest.mark.slow
def test_push_failures_are_clear_and_leave_no_partial_commit(hub, model_and_evaluation):
    model, evaluation = model_and_evaluation
    no_token = {key: value for key, value in hub.env.items() if key != "HF_TOKEN"}
    result = push(hub, model, evaluation, "--repo_id", "user/x", env=no_token)
    assert result.returncode == 2
    assert "error: --repo-id='user/x': a Hub push needs a write token in HF_TOKEN" in result.stderr
    assert hub.repos == {}

    read_only = {**hub.env, "HF_TOKEN": "hf_read_only"}
    result = push(hub, model, evaluation, "--repo_id", "user/x", env=read_only)
    assert result.returncode != 0 and "401" in result.stderr and hub.repos == {}

    hub.fail_next["commit"] = [500, 500]
    result = push(hub, model, evaluation, "--repo_id", "user/y", "--retries", "1")
    assert result.returncode == 1
    message = r"error: pushing \S+ to the Hub repository user/y failed 2 times; the last error: 500"
    assert re.search(message, result.stderr)
    assert "Traceback" not in result.stderr
    assert hub.repos["user/y"].commits == []  # the LFS upload happened, no commit points at it
    assert push(hub, model, evaluation, "--repo_id", "user/y").returncode == 0
    assert len(hub.repos["user/y"].commits) == 1


@pytest.mark.slow
def test_transient_hub_errors_are_retried_with_backoff_into_one_commit(hub, model_and_evaluation):
    model, evaluation = model_and_evaluation
    hub.fail_next.update({"create": [503], "lfs-upload": [502], "commit": [500, 429]})
    result = push(hub, model, evaluation, "--repo_id", "user/flaky")
    assert result.returncode == 0, result.stderr
    assert len(hub.repos["user/flaky"].commits) == 1
    assert hub.file("user/flaky", "tf_model.h5") == Path(model, "tf_model.h5").read_bytes()
    assert all(not statuses for statuses in hub.fail_next.values())  # every injected failure was met
    waits = [float(wait) for wait in re.findall(r"failed \(.*?\); try \d of 5 in ([\d.]+) s", result.stderr)]
    assert len(waits) >= 3 and waits[-1] > waits[-2]  # the waits grow: 1, 2, 4 ... s


@pytest.mark.parametrize("repo_id", ["no-namespace", "a/b/c", "user/has space", "user/-bad", "user/x--y", ""])
def test_bad_repository_ids_are_refused(repo_id):
    with pytest.raises(InvalidParameter, match="must be a Hub repository id"):
        check_repo_id("repo_id", repo_id)


def test_secret_names_are_checked_and_default_to_the_latest_version():
    assert check_secret_name("projects/p/secrets/hf-token") == "projects/p/secrets/hf-token/versions/latest"
    assert check_secret_name("projects/p/secrets/hf/versions/3") == "projects/p/secrets/hf/versions/3"
    for bad in ("hf-token", "projects/p/secrets/", "projects/p/secret/hf", "projects/p/secrets/hf/versions/x"):
        with pytest.raises(InvalidParameter, match=r"--hf-token-secret=.*Secret Manager name"):
            check_secret_name(bad)
    with pytest.raises(InvalidParameter, match="--hf-token-secret="):
        PushArguments(model="/tmp/m", repo_id="user/m", hf_token_secret="my-token")


def test_no_secret_value_lands_in_the_compiled_pipeline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    for target in ("local", "vertex"):
        path = compile_pipeline(str(tmp_path / f"{target}.yaml"), target=target, tpu_image="tpu:1")
        text = Path(path).read_text()
        assert HUB_TOKEN not in text
        spec = yaml.safe_load(text)
        parameters = spec["root"]["inputDefinitions"]["parameters"]
        assert parameters["hf_token_secret"]["defaultValue"] == ""
        secrets = [name for name in parameters if "token" in name.replace("tokenizer", "")]
        assert secrets == ["hf_token_secret"]


def test_the_card_s_metadata_names_the_license_and_a_hub_corpus():
    summary = {
        "arguments": {key: 1 for key in CARD_HYPERPARAMETERS} | {"model_config": "gs://b/c/config.json", "dropout": -1},
        "corpus": {"source": "hf:wikitext:wikitext-103-raw-v1"},
        **{"global_batch_size": 2048, "total_steps": 650, "samples": 1, "tokens": 128, "replicas": 8},
        **{"accelerator": "tpu", "num_parameters": 1, "tokenizer_fingerprint": "sha256:0"},
        **{"first_loss": 9.0, "last_loss": 2.0, "history": [{"step": 1}, {"step": 650}], "steps_this_run": 650},
    }
    config = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
    card = model_card(
        "me/roberta", summary, {**config, "vocab_size": 25000, "hidden_dropout_prob": 0.1}, None, "apache-2.0"
    )
    assert "| dropout | the config's (0.1) |" in card  # the recipe left the model config's
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert metadata["license"] == "apache-2.0" and metadata["datasets"] == ["wikitext"]
    assert {"pytorch", "tensorflow", "safetensors"} <= set(metadata["tags"])
    assert "- license: apache-2.0" in card and "| model_config | config.json |" in card and "gs://" not in card
    assert card.index('pipeline("fill-mask", model="me/roberta")') < card.index('framework="tf"')  # PyTorch first
    with pytest.raises(InvalidParameter, match=r"--license='Apache 2\.0': must be a Hub license id"):
        PushArguments(model="/tmp/m", repo_id="me/m", license="Apache 2.0")


@pytest.mark.slow
def test_a_failed_downstream_probe_is_recorded_and_the_report_and_the_push_still_go(
    tmp_path, hub, model_and_evaluation
):
    """The pipeline's probe step (its runner, as its component calls it) on a probe that fails: the step ends well,
    its results say why, and the run report and the model card say it too (no model-index results)."""
    from kfp.dsl import HTML, Artifact, Markdown, Metrics, Model

    from pipelines.runners import run_downstream, run_report

    model, evaluation = model_and_evaluation
    results = Artifact(uri=str(tmp_path / "downstream"))
    metrics = Metrics(uri=str(tmp_path / "metrics"))
    probe_report = Markdown(uri=str(tmp_path / "probe.md"))
    # a length beyond the model's positions: refused inside the probe, after the step's own checks passed
    run_downstream(Model(uri=model), results, metrics, probe_report, output_root="", max_length=100_000)
    failed = json.loads((tmp_path / "downstream" / "downstream.json").read_text())["failed"]
    assert failed.startswith("InvalidParameter: --max-length=100000: must be at most") and "\n" not in failed
    assert metrics.metadata == {"downstream_failed": 1} and failed in (tmp_path / "probe.md").read_text()
    page = HTML(uri=str(tmp_path / "report.html"))
    run_report(Model(uri=model), Artifact(uri=evaluation), results, page)
    assert f"The probe failed: {html.escape(failed)}" in (tmp_path / "report.html").read_text()
    pushed = push(
        hub, model, evaluation, "--repo_id", "user/probe-failed", "--downstream", str(tmp_path / "downstream")
    )
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    card = hub.file("user/probe-failed", "README.md").decode()
    assert f"The downstream probe failed: {failed}" in card
    assert "model-index" not in yaml.safe_load(card.split("---\n")[1])
