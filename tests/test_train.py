import html
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    PROJECT_ROOT,
    TINY_TRAINING,
    WIKITEXT_VOCAB_SIZE,
    made_once,
    run_at,
    run_module,
    scheduled_rates,
    train_tiny,
)
from transformers import AutoTokenizer, TFAutoModelForMaskedLM, pipeline

from components.evaluate import EvaluateArguments, evaluate
from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.modeling import PRESETS, model_config
from components.lib.pytorch_weights import TF_LOADING
from components.lib.results import SUMMARY_FILE
from components.lib.shard_set import read_manifest
from components.report import ReportArguments, write_report
from components.shards import ShardArguments, write_shards
from components.train import TrainArguments, train

TINY = {**TINY_TRAINING, "log_every_steps": 10}


def save_untrained(folder: Path, shards: dict) -> str:
    manifest = read_manifest(shards["train"])
    model = TFAutoModelForMaskedLM.from_config(model_config("tiny", manifest))
    model(model.dummy_inputs)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(shards["tokenizer"]).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, wikitext_shards):
    def make(folder: Path) -> None:
        train_tiny(
            folder / "model",
            wikitext_shards,
            eval_shards=wikitext_shards["validation"],
            max_steps=150,
            learning_rate=1e-3,
            checkpoint_every_steps=75,
            log_every_steps=10,
            peak_tflops=1.0,
            price_per_hour=3.6,
        )

    output = made_once(tmp_path_factory, "trained", make) / "model"
    return str(output), json.loads((output / SUMMARY_FILE).read_text())


@pytest.mark.xdist_group("trained")  # one process makes the model; the others need not wait on it
@pytest.mark.slow
def test_training_lowers_the_evaluation_loss_against_the_untrained_model(tmp_path, wikitext_shards, trained):
    model_dir, summary = trained
    untrained = save_untrained(tmp_path / "untrained", wikitext_shards)
    common = {"shards": wikitext_shards["validation"], "fill_mask": ""}
    before = evaluate(EvaluateArguments(model=untrained, output=str(tmp_path / "before"), **common))
    after = evaluate(EvaluateArguments(model=model_dir, output=str(tmp_path / "after"), **common))
    assert before["masked_tokens"] == after["masked_tokens"]  # the same masked positions
    assert after["loss"] < before["loss"] - 1.0
    assert after["perplexity"] < before["perplexity"] / 2
    assert after["masked_accuracy"] > before["masked_accuracy"]
    assert summary["last_loss"] < summary["first_loss"]


@pytest.mark.xdist_group("trained")  # one process makes the model; the others need not wait on it
@pytest.mark.slow
def test_summary_history_tensorboard_and_mfu(trained):
    model_dir, summary = trained
    assert summary["total_steps"] == 150 and summary["resumed_from_step"] == 0
    assert [point["step"] for point in summary["history"]] == list(range(10, 151, 10))
    assert summary["samples"] == 150 * 16 and summary["tokens"] == 150 * 16 * 128
    model = TFAutoModelForMaskedLM.from_pretrained(model_dir, **TF_LOADING)
    model(model.dummy_inputs)
    # the parameters the model has, counted from its variables (the summary counts them from the config)
    assert summary["num_parameters"] == sum(int(np.prod(variable.shape)) for variable in model.trainable_variables)
    # 6 FLOPs a parameter and token, plus attention's 12 x 2 layers x 64 hidden x 128 positions, x 16 x 128 tokens
    assert summary["model_flops_per_step"] == (6 * summary["num_parameters"] + 12 * 2 * 64 * 128) * 16 * 128
    for point in summary["history"]:
        assert point["samples_per_second"] > 0
        assert point["tokens_per_second"] == pytest.approx(point["samples_per_second"] * 128)
        assert point["mfu"] == pytest.approx(point["model_tflops_per_second"] / 1.0)
    assert summary["history"][-1]["learning_rate"] == pytest.approx(0.0, abs=1e-9)
    event_files = list(Path(model_dir, "logs").glob("events.out.tfevents.*"))
    tags = {
        value.tag
        for file in event_files
        for event in tf.compat.v1.train.summary_iterator(str(file))
        for value in event.summary.value
    }
    assert {"train/loss", "train/gradient_norm", "train/learning_rate", "train/samples_per_second", "train/mfu"} <= tags
    assert "eval/loss" in tags
    assert all(point["gradient_norm"] > 0 for point in summary["history"])  # the global norm, beside the loss
    assert json.loads(Path(model_dir, SUMMARY_FILE).read_text())["total_steps"] == 150
    # the run's cost at the price given, and each log point's projection of the whole run's
    assert summary["cost_this_run"] == pytest.approx(3.6 * summary["seconds_this_run"] / 3600, rel=1e-3)
    assert all(point["projected_cost"] > 0 for point in summary["history"])


@pytest.mark.xdist_group("trained")  # one process makes the model; the others need not wait on it
@pytest.mark.slow
def test_the_output_loads_in_the_fill_mask_pipeline(trained, wikitext_shards):
    model_dir, _ = trained
    model = TFAutoModelForMaskedLM.from_pretrained(model_dir, **TF_LOADING)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.vocab_size == len(tokenizer)
    assert (model.config.pad_token_id, model.config.bos_token_id, model.config.eos_token_id) == (1, 0, 2)
    fill = pipeline("fill-mask", model=model_dir, framework="tf", dtype=None, model_kwargs=TF_LOADING)
    predictions = fill(f"The game was released in {tokenizer.mask_token} .", top_k=3)
    assert len(predictions) == 3
    assert all(p["token_str"] in p["sequence"] for p in predictions)
    assert predictions[0]["score"] >= predictions[1]["score"] >= predictions[2]["score"]


RESUME_ARGS = ["--model_config", "tiny", "--per_replica_batch_size", "16", "--accelerator", "cpu", "--max_steps", "60"]
RESUME_ARGS += ["--checkpoint_every_steps", "20", "--log_every_steps", "10", "--steps_per_execution", "5"]


@pytest.mark.slow
def test_a_trainer_killed_after_a_checkpoint_resumes_there_and_ends_at_the_planned_step(wikitext_shards, gcs):
    """On gs:// (the emulator), as on Vertex AI; the same on local folders and at 4 replicas, and a SIGTERM's
    checkpoint at 2: tests/test_replicas.py."""
    output = f"{gcs}/model"
    data = ["--tokenizer", wikitext_shards["tokenizer"], "--train_shards", wikitext_shards["train"]]
    # in a batch warm-up (the same global batch of 16 as 4 micro-batches of 4): 1 micro-batch a step to step 15, 2 to
    # step 30, then 4; each later stage checkpoints before it compiles (15, 30), and the kill after the checkpoint of
    # step 20 is in the second stage
    warmup = ["--per_replica_batch_size", "4", "--gradient_accumulation_steps", "4", "--batch_warmup_fraction", "0.5"]
    job = ["components.train", *data, *RESUME_ARGS, *warmup, "--output", output]
    save = "tensorflow.python.checkpoint.checkpoint_management:CheckpointManager.save"
    killed = run_at(["--function", save, "--after", "--nth", "2"], *job)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert tf.train.latest_checkpoint(f"{output}/checkpoints").endswith("ckpt-20")
    assert not tf.io.gfile.exists(f"{output}/{SUMMARY_FILE}")

    rerun = run_module(*job)
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(storage.read_text(f"{output}/{SUMMARY_FILE}"))
    assert "resuming from" in rerun.stderr
    assert summary["resumed_from_step"] == 20
    assert summary["total_steps"] == 60 and summary["steps_this_run"] == 40
    assert tf.train.latest_checkpoint(f"{output}/checkpoints").endswith("ckpt-60")
    kept = tf.train.get_checkpoint_state(f"{output}/checkpoints").all_model_checkpoint_paths
    assert [path.rsplit("-", 1)[1] for path in kept] == ["30", "40", "60"]  # the third stage's before its compile
    assert tf.io.gfile.exists(f"{output}/tf_model.h5")
    # the killed attempt stays "running" in the record (it counts as a failure), the rerun from step 20 is done
    attempts = json.loads(tf.io.gfile.GFile(f"{output}/checkpoints/attempts.json").read())
    assert [(a["step"], a["outcome"]) for a in attempts] == [(0, "running"), (20, "done")]
    # the history spans both runs (the first's points kept beside the checkpoints), and the learning-rate
    # schedule went on where it was, not from the start
    assert [point["step"] for point in summary["history"]] == list(range(10, 61, 10))
    assert [point["learning_rate"] for point in summary["history"]] == pytest.approx(scheduled_rates(summary))
    # the warm-up's stages, and the samples read by each point's step: the stream's place, which the masking rate's
    # decay (30% to 15%, the default recipe's) follows through the kill
    assert summary["batch_stages"] == [[0, 1], [15, 2], [30, 4]]
    step_samples = [4 if step < 15 else 8 if step < 30 else 16 for step in range(60)]
    read = [sum(step_samples[: point["step"]]) for point in summary["history"]]
    assert [point["samples"] for point in summary["history"]] == read and summary["samples"] == sum(step_samples)
    expected_masking = [0.3 - 0.15 * samples / sum(step_samples) for samples in read]
    assert [point["mlm_probability"] for point in summary["history"]] == pytest.approx(expected_masking)


@pytest.mark.slow  # three trainings in subprocesses
def test_a_sigterm_while_the_step_starts_is_no_failure_however_often_it_comes(tmp_path, wikitext_shards):
    """Preemptions before the first step (the TPU starting, the first compile: long native calls that give Python
    no turn) end the attempt as stopped, at once; the attempt after two of them is not refused."""
    checkpoints = tmp_path / "checkpoints"
    data = ["--tokenizer", wikitext_shards["tokenizer"], "--train_shards", wikitext_shards["train"]]
    job = ["components.train", *data, *RESUME_ARGS, "--output", str(tmp_path / "model")]
    job += ["--max_steps", "10", "--checkpoint_dir", str(checkpoints)]
    hang = [
        sys.executable,
        str(PROJECT_ROOT / "tests" / "kill_at.py"),
        "--function",
        "components.train:start_or_resume",
    ]
    for attempt in range(2):
        process = subprocess.Popen(
            [*hang, "--action", "hang", "--exit_grace", "2", "--", *job],
            cwd=PROJECT_ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        )
        record = checkpoints / "attempts.json"
        deadline = time.monotonic() + 300
        while not (record.exists() and len(json.loads(record.read_text())) == attempt + 1):
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)  # the attempt is running, and its main thread hangs in native code
        assert process.wait(timeout=60) == 128 + signal.SIGTERM, process.stderr.read()[-3000:]
        assert "SIGTERM: the step did not stop within 2 s" in process.stderr.read()
    attempts = json.loads((checkpoints / "attempts.json").read_text())
    assert [(a["step"], a["outcome"], a["error"]) for a in attempts] == [(0, "stopped", "SIGTERM")] * 2

    third = run_module(*job)
    assert third.returncode == 0, third.stderr[-3000:]
    attempts = json.loads((checkpoints / "attempts.json").read_text())
    assert [a["outcome"] for a in attempts] == ["stopped", "stopped", "done"]


@pytest.mark.slow  # three start-ups in subprocesses
def test_a_start_that_hangs_is_a_failed_attempt_and_the_third_is_refused(tmp_path, wikitext_shards):
    """A TPU whose initialisation hangs (a native call that never returns) fails the attempt at its deadline, so
    the restarts and retries that follow are not each paid until the job's timeout."""
    checkpoints = tmp_path / "checkpoints"
    data = ["--tokenizer", wikitext_shards["tokenizer"], "--train_shards", wikitext_shards["train"]]
    job = ["components.train", *data, *RESUME_ARGS, "--output", str(tmp_path / "model")]
    job += ["--checkpoint_dir", str(checkpoints), "--start_minutes", "0.05"]
    hang = [
        sys.executable,
        str(PROJECT_ROOT / "tests" / "kill_at.py"),
        "--function",
        "components.train:select_strategy",
    ]
    for _ in range(2):
        hung = subprocess.run(
            [*hang, "--action", "hang", "--", *job],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        )
        assert hung.returncode == 1, hung.stderr[-3000:]
        assert "the accelerator did not start within 0.05 min: this attempt fails" in hung.stderr
    attempts = json.loads((checkpoints / "attempts.json").read_text())
    assert [(a["outcome"], a["error"]) for a in attempts] == [
        ("failed", "the accelerator did not start within 0.05 min (--start_minutes)")
    ] * 2
    refused = run_module(*job)  # the same start would hang again: refused in seconds, before the TPU is touched
    assert refused.returncode == 2
    assert "the last 2 attempts of this training, with these settings and runtime, failed from step 0: the " in (
        refused.stderr
    )


def test_xla_is_never_nested_inside_the_tpu_step():
    from components.train import _use_xla

    assert [_use_xla(choice, "tpu") for choice in ("auto", "on", "off")] == [False, False, False]
    assert [_use_xla(choice, "cpu") for choice in ("auto", "on", "off")] == [False, True, False]


@pytest.mark.slow
def test_a_failed_background_checkpoint_push_is_reported_and_training_goes_on(tmp_path, wikitext_shards, hub):
    hub.fail_next["commit"] = [403, 403]  # a refusal: no retry, each checkpoint's push fails at once
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.train",
            "--tokenizer",
            wikitext_shards["tokenizer"],
            "--train_shards",
            wikitext_shards["train"],
            "--model_config",
            "tiny",
            "--per_replica_batch_size",
            "16",
            "--accelerator",
            "cpu",
            "--max_steps",
            "10",
            "--checkpoint_every_steps",
            "5",
            "--hub_repo_id",
            "user/flaky",
            "--output",
            str(tmp_path / "m"),
        ],
        cwd=PROJECT_ROOT,
        env=hub.env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "m" / SUMMARY_FILE).read_text())
    assert summary["total_steps"] == 10 and len(summary["hub_push_failures"]) == 2
    assert summary["hub_push_failures"][0].startswith("Training checkpoint at step 5 of 10: ")
    assert result.stderr.count("background push to user/flaky failed") == 2
    assert hub.repos["user/flaky"].commits == [] and not list(Path(tempfile.gettempdir()).glob("hub-checkpoint-*"))


def test_presets_take_vocabulary_and_special_ids_from_the_shards(wikitext_shards):
    manifest = read_manifest(wikitext_shards["train"])
    base = model_config("roberta-base", manifest)
    assert (base.hidden_size, base.num_hidden_layers, base.num_attention_heads, base.intermediate_size) == (
        768,
        12,
        12,
        3072,
    )
    large = model_config("roberta-large", manifest)
    assert (large.hidden_size, large.num_hidden_layers, large.num_attention_heads) == (1024, 24, 16)
    mini = model_config("mini", manifest)  # the first local run's: no dropout
    assert (mini.hidden_size, mini.hidden_dropout_prob, mini.attention_probs_dropout_prob) == (128, 0.0, 0.0)
    for config in (base, large, mini, model_config("tiny", manifest)):
        assert config.vocab_size == manifest["vocab_size"] == WIKITEXT_VOCAB_SIZE
        assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (1, 0, 2)
        assert config.max_position_embeddings >= manifest["max_length"] + 2
    assert set(PRESETS) == {"tiny", "mini", "roberta-base", "roberta-large"}


def test_a_config_json_with_too_few_positions_is_refused(tmp_path, wikitext_shards):
    manifest = read_manifest(wikitext_shards["train"])
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "roberta", "max_position_embeddings": 100, "hidden_size": 32, "num_attention_heads": 2}
        )
    )
    with pytest.raises(InvalidParameter, match=r"--model-config=.*has 100 position embeddings, too few"):
        model_config(str(tmp_path / "config.json"), manifest)
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "roberta", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1})
    )
    config = model_config(str(tmp_path / "config.json"), manifest)
    assert config.hidden_size == 32 and config.vocab_size == WIKITEXT_VOCAB_SIZE


@pytest.fixture(scope="module")
def other_shards(tmp_path_factory, wikitext, embedded_tokenizer, wikitext_tokenizer):
    root = tmp_path_factory.mktemp("other")
    write_shards(ShardArguments(output=str(root / "other-tokenizer"), tokenizer=embedded_tokenizer))
    write_shards(
        ShardArguments(
            output=str(root / "length-64"),
            tokenizer=wikitext_tokenizer,
            corpus=str(wikitext / "test.txt"),
            max_length=64,
            limit=300,
        )
    )
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"train_shards": "OTHER/other-tokenizer"}, r"--train-shards=.*were made with another tokenizer"),
        ({"eval_shards": "OTHER/length-64"}, r"--eval-shards=.*have max_length 64, the training shards 128"),
        ({"train_shards": "OTHER/empty"}, r"--train-shards=.*holds no finished shard set"),
        ({"per_replica_batch_size": 100_000}, r"--per-replica-batch-size=100000: x 1 replica\(s\) = global batch"),
        ({"model_config": "roberta-huge"}, r"--model-config='roberta-huge': unknown preset"),
        ({"learning_rate": -1e-4}, r"--learning-rate=-0.0001: must be a positive number"),
        ({"mlm_probability": 1.5}, r"--mlm-probability=1.5"),
        ({"warmup_fraction": 1.0}, r"--warmup-fraction=1.0"),
        ({"accelerator": "quantum"}, r"--accelerator='quantum'"),
        ({"hub_repo_id": "not a repo"}, r"--hub-repo-id='not a repo': must be a Hub repository id"),
        ({"output": "http://example.com/model"}, r"--output='http://example.com/model': unsupported URI scheme"),
    ],
)
def test_bad_input_fails_before_training_and_writes_nothing(
    tmp_path, wikitext_shards, other_shards, arguments, message
):
    arguments = {
        key: value.replace("OTHER", str(other_shards)) if isinstance(value, str) else value
        for key, value in arguments.items()
    }
    output = tmp_path / "model"
    values = {
        "tokenizer": wikitext_shards["tokenizer"],
        "train_shards": wikitext_shards["train"],
        "output": str(output),
        "max_steps": 5,
        **TINY,
        **arguments,
    }
    with pytest.raises(InvalidParameter, match=message):
        train(TrainArguments(**values))
    assert not output.exists()


def test_evaluation_refuses_shards_of_another_tokenizer(tmp_path, wikitext_shards, other_shards):
    model_dir = save_untrained(tmp_path / "model", wikitext_shards)
    with pytest.raises(InvalidParameter, match=r"--shards=.*another tokenizer"):
        evaluate(
            EvaluateArguments(
                model=model_dir, shards=str(other_shards / "other-tokenizer"), output=str(tmp_path / "eval")
            )
        )
    with pytest.raises(InvalidParameter, match=r"--fill-mask='no mask here': each sentence needs exactly one"):
        evaluate(
            EvaluateArguments(
                model=model_dir,
                shards=wikitext_shards["validation"],
                output=str(tmp_path / "eval"),
                fill_mask="no mask here",
            )
        )
    assert not (tmp_path / "eval").exists()


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_evaluation_is_reproducible_and_writes_a_report(tmp_path, wikitext_shards):
    model_dir = save_untrained(tmp_path / "model", wikitext_shards)
    runs = [
        evaluate(
            EvaluateArguments(
                model=model_dir, shards=wikitext_shards["validation"], output=str(tmp_path / f"eval{i}"), top_k=2
            )
        )
        for i in range(2)
    ]
    for key in ("loss", "perplexity", "masked_accuracy", "masked_tokens"):
        assert runs[0][key] == runs[1][key]
    saved = json.loads((tmp_path / "eval0" / "metrics.json").read_text())
    assert saved["loss"] == runs[0]["loss"] and len(saved["fill_mask"]) == 3
    assert all(len(example["predictions"]) == 2 for example in saved["fill_mask"])
    report = (tmp_path / "eval0" / "report.md").read_text()
    assert f"{runs[0]['loss']:.4f}" in report and "masked-token accuracy" in report


def test_the_masked_positions_loss_equals_the_full_logits_loss(wikitext_shards):
    from components.lib.input_pipeline import Masking, evaluation_dataset
    from components.lib.masked_lm import masked_lm_loss, max_predictions

    manifest = read_manifest(wikitext_shards["validation"])
    model = TFAutoModelForMaskedLM.from_config(model_config("tiny", manifest))
    batch = next(iter(evaluation_dataset(wikitext_shards["validation"], manifest, 32, Masking.from_manifest(manifest))))
    reference = float(tf.reduce_mean(model(batch, training=False).loss))
    assert float(masked_lm_loss(model, batch, max_predictions(128, 0.15), training=False)) == pytest.approx(
        reference, rel=1e-5
    )
    assert max_predictions(128, 0.15) == 45
    assert int(tf.reduce_max(tf.reduce_sum(tf.cast(batch["labels"] >= 0, tf.int32), axis=1))) <= 45


@pytest.mark.slow  # trains in the test: out of the fast tier (make test-fast under 3 minutes)
def test_accumulated_micro_batches_step_by_the_mean_of_their_gradients(wikitext_shards):
    """Gradient accumulation: one optimizer step over two micro-batches moves the weights by the mean of the two
    steps each micro-batch alone would take (plain SGD, linear in the gradient), from the same weights."""
    from components.lib.input_pipeline import Masking, evaluation_dataset
    from components.lib.masked_lm import max_predictions
    from components.lib.train_function import train_function

    manifest = read_manifest(wikitext_shards["validation"])
    config = model_config("tiny", manifest)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # the same forward pass every time
    stream = evaluation_dataset(wikitext_shards["validation"], manifest, 8, Masking.from_manifest(manifest))
    first, second = list(stream.take(2))
    strategy = tf.distribute.get_strategy()
    initial = TFAutoModelForMaskedLM.from_config(config)
    initial(first)
    start = initial.get_weights()

    def one_step(batches: list, accumulation: int) -> list[np.ndarray]:
        model = TFAutoModelForMaskedLM.from_config(config)
        model(first)
        model.set_weights(start)
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.5)
        dataset = tf.data.Dataset.from_tensors(batches[0])
        for batch in batches[1:]:
            dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
        run = train_function(model, optimizer, strategy, False, max_predictions(128, 0.15), accumulation)
        loss, norm = run(iter(dataset), tf.constant(1))
        assert np.isfinite(float(loss)) and float(norm) > 0
        return model.get_weights()

    alone = [one_step([first], 1), one_step([second], 1)]
    accumulated = one_step([first, second], 2)
    moved = 0.0
    for index, weights in enumerate(accumulated):
        expected = (alone[0][index] + alone[1][index]) / 2
        np.testing.assert_allclose(weights, expected, rtol=1e-4, atol=1e-6)
        moved = max(moved, float(np.abs(weights - start[index]).max()))
    assert moved > 1e-3  # the step did move the weights


@pytest.mark.slow
def test_checkpoints_sync_to_the_hub_through_the_real_client(tmp_path, wikitext_shards, hub):
    from huggingface_hub import snapshot_download

    args = [
        "--tokenizer",
        wikitext_shards["tokenizer"],
        "--train_shards",
        wikitext_shards["train"],
        "--model_config",
        "tiny",
        "--per_replica_batch_size",
        "16",
        "--accelerator",
        "cpu",
        "--max_steps",
        "20",
        "--checkpoint_every_steps",
        "10",
        "--hub_repo_id",
        "user/tiny-checkpoints",
        "--hub_private",
        "true",
        "--output",
        str(tmp_path / "m"),
    ]
    result = run_module("components.train", *args, env=hub.env)
    assert result.returncode == 0, result.stderr
    assert hub.env["HF_TOKEN"] not in result.stdout + result.stderr
    repo = hub.repos["user/tiny-checkpoints"]
    assert repo.private
    assert [c["message"] for c in repo.commits] == [
        "Training checkpoint at step 10 of 20",
        "Training checkpoint at step 20 of 20",
    ]
    assert {"config.json", "tf_model.h5", "tokenizer.json"} <= set(repo.files)
    assert all("model.safetensors" in commit["files"] for commit in repo.commits)  # PyTorch weights at every one
    assert hub.file("user/tiny-checkpoints", "model.safetensors") == (tmp_path / "m" / "model.safetensors").read_bytes()
    folder = snapshot_download(
        "user/tiny-checkpoints", token=hub.env["HF_TOKEN"], endpoint=hub.url, cache_dir=str(tmp_path / "cache")
    )
    assert Path(folder, "tf_model.h5").read_bytes() == Path(tmp_path / "m" / "tf_model.h5").read_bytes()

    env = {key: value for key, value in hub.env.items() if key != "HF_TOKEN"}
    missing = run_module("components.train", *args[:-1], str(tmp_path / "m2"), env=env)
    assert missing.returncode == 2
    assert "error: --hub-repo-id='user/tiny-checkpoints': a Hub push needs a write token in HF_TOKEN" in missing.stderr
    assert not (tmp_path / "m2").exists()


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_vertex_environment_variables_choose_the_output_folders(tmp_path, monkeypatch, wikitext_shards):
    monkeypatch.setenv("AIP_MODEL_DIR", str(tmp_path / "aip-model"))
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", str(tmp_path / "aip-checkpoints"))
    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", str(tmp_path / "aip-tensorboard"))
    arguments = TrainArguments(
        tokenizer=wikitext_shards["tokenizer"],
        train_shards=wikitext_shards["train"],
        max_steps=4,
        checkpoint_every_steps=2,
        **TINY,
    )
    assert arguments.output == str(tmp_path / "aip-model")
    train(arguments)
    assert (tmp_path / "aip-model" / SUMMARY_FILE).exists()
    assert tf.train.latest_checkpoint(str(tmp_path / "aip-checkpoints")).endswith("ckpt-4")
    assert list((tmp_path / "aip-tensorboard").glob("events.out.tfevents.*"))
    monkeypatch.delenv("AIP_MODEL_DIR")
    with pytest.raises(InvalidParameter, match=r"--output='': is required \(or set AIP_MODEL_DIR\)"):
        TrainArguments(tokenizer=wikitext_shards["tokenizer"], train_shards=wikitext_shards["train"])


def test_a_truncated_or_missing_shard_is_named_before_training(tmp_path, wikitext_shards):
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(wikitext_shards["train"], copy)
    manifest = read_manifest(str(copy))
    first = copy / manifest["files"][0]["name"]
    first.write_bytes(first.read_bytes()[:1000])
    values = {
        "tokenizer": wikitext_shards["tokenizer"],
        "train_shards": str(copy),
        "output": str(tmp_path / "m"),
        "max_steps": 2,
        **TINY,
    }
    with pytest.raises(InvalidParameter, match=rf"--train-shards=.*shard {first.name} has 1000 bytes, manifest"):
        train(TrainArguments(**values))
    first.unlink()
    with pytest.raises(InvalidParameter, match=rf"shard {first.name} listed in manifest.json is missing"):
        train(TrainArguments(**values))
    assert not (tmp_path / "m").exists()


@pytest.mark.slow  # trains in the test: out of the fast tier (make test-fast under 3 minutes)
def test_a_corrupted_shard_of_the_right_size_is_named_by_training_and_evaluation(tmp_path, wikitext_shards):
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(wikitext_shards["train"], copy)
    manifest = read_manifest(str(copy))
    last = copy / manifest["files"][-1]["name"]
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside a record: same size, so verify_files passes
    last.write_bytes(bytes(data))
    message = rf"--train-shards='{copy}': shard {last.name} is corrupted \(corrupted record at \d+\)"
    arguments = dict(tokenizer=wikitext_shards["tokenizer"], train_shards=str(copy), max_steps=2, **TINY)
    checkpoints = str(tmp_path / "checkpoints")  # a run's, which its restarted jobs and retried tasks share
    for attempt in range(2):
        with pytest.raises(InvalidParameter, match=message):
            train(TrainArguments(**arguments, output=str(tmp_path / f"model-{attempt}"), checkpoint_dir=checkpoints))
        assert not (tmp_path / f"model-{attempt}" / SUMMARY_FILE).exists()
    # a third attempt that would fail the same way is refused before the model is built
    refused = r"the last 2 attempts of this training, with these settings and runtime, failed from step 0: "
    with pytest.raises(InvalidParameter, match=refused + "InvalidParameter: --train-shards="):
        train(TrainArguments(**arguments, output=str(tmp_path / "model-2"), checkpoint_dir=checkpoints))
    # other settings are another attempt
    with pytest.raises(InvalidParameter, match=message):
        train(TrainArguments(**{**arguments, "seed": 7}, output=str(tmp_path / "model-3"), checkpoint_dir=checkpoints))

    model = save_untrained(tmp_path / "untrained", wikitext_shards)
    with pytest.raises(InvalidParameter, match=rf"--shards='{copy}': shard {last.name} is corrupted"):
        evaluate(EvaluateArguments(model=model, shards=str(copy), output=str(tmp_path / "evaluation")))
    assert not (tmp_path / "evaluation").exists()


@pytest.mark.slow  # trains in the test: out of the fast tier (make test-fast under 3 minutes)
def test_a_fixed_checkpoint_dir_lets_a_rerun_of_the_train_step_resume_and_refuses_another_model(
    tmp_path, wikitext_shards, hub, capsys
):
    from kfp.dsl import Artifact, Dataset, Model

    from components.preflight import PreflightArguments, preflight
    from pipelines.steps import STEPS, make_component

    train_step = make_component(STEPS["train"], "image").python_func  # the function the component runs

    checkpoints = str(tmp_path / "checkpoints")  # outside the runs' model artifacts, as a pipeline parameter
    step_arguments = dict(
        model_config="tiny",
        per_replica_batch_size=16,
        num_epochs=1,
        max_steps=6,
        learning_rate=1e-3,
        warmup_fraction=0.0,
        weight_decay=0.0,
        mlm_probability=0.15,
        bf16=False,
        steps_per_execution=3,
        shuffle_buffer=100,
        seed=0,
        checkpoint_every_steps=3,
        log_every_steps=3,
        accelerator="cpu",
        replicas=0,
        price_per_hour=0.0,  # the vertex target's default: the TPU type's list price for its provisioning
        tpu_type="v5e-1",
        tpu_provisioning="SPOT",
        peak_tflops=0.0,
        checkpoint_dir=checkpoints,
        output_root="",
        tokenizer=Artifact(uri=wikitext_shards["tokenizer"]),
        train_shards=Dataset(uri=wikitext_shards["train"]),
        eval_shards=Dataset(uri=wikitext_shards["validation"]),
    )
    for run in ("first", "second"):  # two pipeline runs: each has a model artifact of its own
        train_step(**step_arguments, model=Model(uri=str(tmp_path / run / "model")))
    first, second = (json.loads((tmp_path / run / "model" / SUMMARY_FILE).read_text()) for run in ("first", "second"))
    assert first["resumed_from_step"] == 0 and first["steps_this_run"] == 6
    assert second["resumed_from_step"] == 6 and second["steps_this_run"] == 0  # nothing trained twice
    # the rerun reports the training that the first run did: report and push show it
    assert second["history"] == first["history"] and second["first_loss"] == first["first_loss"]
    evaluation = str(tmp_path / "evaluation")
    evaluate(
        EvaluateArguments(
            model=str(tmp_path / "second" / "model"),
            shards=wikitext_shards["validation"],
            output=evaluation,
            max_batches=1,
            fill_mask="",
        )
    )
    write_report(
        ReportArguments(
            model=str(tmp_path / "second" / "model"), evaluation=evaluation, output=str(tmp_path / "report.html")
        )
    )
    figures = f"{first['first_loss']:.4f} at step 3, {first['last_loss']:.4f} at step 6 (this run found all 6 steps"
    assert figures in (tmp_path / "report.html").read_text()
    # the cost lines, at a list price labelled as such
    assert first["arguments"]["price_per_hour"] == 0.245 and first["cost_this_run"] > 0
    label = html.escape("the v5e-1's Spot list price; Cloud TPU list prices")
    assert label in (tmp_path / "report.html").read_text()
    pushed = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.push",
            "--model",
            str(tmp_path / "second" / "model"),
            "--evaluation",
            evaluation,
            "--repo_id",
            "user/rerun",
        ],
        cwd=PROJECT_ROOT,
        env=hub.env,
        capture_output=True,
        text=True,
    )
    assert pushed.returncode == 0, pushed.stderr
    assert figures in hub.file("user/rerun", "README.md").decode()
    assert json.loads((tmp_path / "checkpoints" / "checkpoint_identity.json").read_text())["model_config"]

    other = tmp_path / "other-config.json"
    config = json.loads((tmp_path / "first" / "model" / "config.json").read_text())
    other.write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    message = rf"--checkpoint-dir='{checkpoints}': holds checkpoints of another model \(num_hidden_layers differ\)"
    with pytest.raises(InvalidParameter, match=message):  # preflight says it before the TPU step starts
        preflight(
            PreflightArguments(
                tokenizer=wikitext_shards["tokenizer"],
                train_shards=wikitext_shards["train"],
                output=str(tmp_path / "preflight"),
                model_config=str(other),
                per_replica_batch_size=16,
                checkpoint_dir=checkpoints,
            )
        )
    with pytest.raises(SystemExit) as refused:  # the component ends as its command would: status 2, one line
        train_step(**{**step_arguments, "model_config": str(other)}, model=Model(uri=str(tmp_path / "third")))
    assert refused.value.code == 2 and re.search(message, capsys.readouterr().err.strip().splitlines()[-1])
    # the same model under another recipe (a default that changed between the runs): refused, with the flags
    # that resume it as it was trained
    message = (
        "holds checkpoints trained with other recipe knobs; resume them with --recipe roberta-2019-mask-decay-clip "
    )
    resume = "--final_mlm_probability 0.15 --adam_beta2 0.98 --adam_epsilon 1e-06"
    with pytest.raises(InvalidParameter, match=message + resume):
        preflight(
            PreflightArguments(
                tokenizer=wikitext_shards["tokenizer"],
                train_shards=wikitext_shards["train"],
                output=str(tmp_path / "preflight"),
                model_config="tiny",
                per_replica_batch_size=16,
                checkpoint_dir=checkpoints,
                recipe="hf-2023",
                learning_rate=1e-3,
                warmup_fraction=0.0,
                weight_decay=0.0,
                mlm_probability=0.15,
            )
        )
    assert not (tmp_path / "third").exists() and not (tmp_path / "preflight").exists()
