"""Many replicas on the CPU: the distributed code path a TPU takes (``PerReplica`` values, distributed datasets,
cross-replica sums, checkpoints under a strategy), rehearsed with ``--accelerator cpu --replicas N``.

TensorFlow splits the CPU only before it creates its devices, so each run is a process of its own, as on a
TPU VM."""

import functools
import json
import signal

import numpy as np
import pytest
import tensorflow as tf
from conftest import LONG_TEST_SECONDS, run_at, run_module, scheduled_rates
from transformers import TFAutoModelForMaskedLM

from components.lib import storage
from components.lib.input_pipeline import Masking, evaluation_dataset
from components.lib.masked_lm import MaskedLMScorer, max_predictions
from components.lib.modeling import model_config
from components.lib.results import SUMMARY_FILE
from components.lib.shard_set import read_manifest


def train_command(shards: dict, output, *extra: str) -> list[str]:
    return [
        "components.train",
        "--tokenizer",
        shards["tokenizer"],
        "--train_shards",
        shards["train"],
        "--eval_shards",
        shards["validation"],
        "--model_config",
        "tiny",
        "--accelerator",
        "cpu",
        "--output",
        str(output),
        *extra,
    ]


@pytest.mark.slow  # trains in the test: out of the fast tier (make test-fast under 3 minutes)
def test_two_cpu_replicas_accumulate_micro_batches_into_the_global_batch(tmp_path, embedded_shards):
    command = train_command(embedded_shards, tmp_path / "model", "--replicas", "2", "--per_replica_batch_size", "16")
    command += ["--gradient_accumulation_steps", "3", "--num_epochs", "1", "--log_every_steps", "5"]
    command += ["--batch_warmup_fraction", "0.5"]  # on both replicas: the first half of the steps at 1, then 2
    result = run_module(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "model" / SUMMARY_FILE).read_text())
    samples = read_manifest(embedded_shards["train"])["num_records"]
    assert summary["global_batch_size"] == 96 and summary["total_steps"] == samples // 96  # an epoch of steps
    assert "global batch 96 (3 micro-batch(es) of 16 per replica)" in result.stderr
    assert all(point["loss"] > 0 for point in summary["history"])
    # the warm-up's stages at 2 replicas: micro-batches of 32 over both, 1 then 2 a step, then 3
    steps = summary["total_steps"]
    assert summary["batch_stages"] == [[0, 1], [round(steps / 2 / 2), 2], [round(steps / 2), 3]]
    per_step = [next(m for start, m in reversed(summary["batch_stages"]) if step >= start) for step in range(steps)]
    assert summary["samples"] == 32 * sum(per_step)
    assert [point["learning_rate"] for point in summary["history"]] == pytest.approx(scheduled_rates(summary))


@pytest.mark.slow  # trains in the test
def test_two_cpu_replicas_checkpoint_on_a_sigterm_validate_at_each_checkpoint_and_the_rerun_ends_at_the_planned_step(
    tmp_path, embedded_shards
):
    """What a Spot TPU's preemption (or Vertex AI stopping a job) sends: SIGTERM, then about 30 s. At the first log
    point (step 3), between periodic checkpoints, the job checkpoints there, the per-host input's stream with it,
    exits as stopped, and its rerun loses no step, validating at each checkpoint on both replicas."""
    output = tmp_path / "model"
    command = train_command(embedded_shards, output, "--replicas", "2", "--per_replica_batch_size", "8")
    command += ["--max_steps", "9", "--checkpoint_every_steps", "6", "--log_every_steps", "3", "--eval_batches", "1"]
    term = ["--function", "components.lib.training_log:LogWindow.point", "--action", "term"]
    stopped = run_at(term, *command)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "SIGTERM: checkpoint at step 3 of 9 saved" in stopped.stderr
    assert tf.train.latest_checkpoint(str(output / "checkpoints")).endswith("ckpt-3")
    assert not (output / SUMMARY_FILE).exists()  # nothing that looks done

    resumed = run_module(*command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "2 CPU replicas (logical devices) under MirroredStrategy" in resumed.stderr
    summary = json.loads((output / SUMMARY_FILE).read_text())
    assert summary["replicas"] == 2 and summary["global_batch_size"] == 16
    assert summary["resumed_from_step"] == 3 and summary["steps_this_run"] == 6
    assert resumed.stderr.count("validation loss") == 2  # the distributed validation, at both checkpoints
    assert tf.train.latest_checkpoint(str(output / "checkpoints")).endswith("ckpt-9")
    attempts = json.loads((output / "checkpoints" / "attempts.json").read_text())  # a preemption is no failure
    assert [(a["step"], a["outcome"]) for a in attempts] == [(0, "stopped"), (3, "done")]
    assert [point["step"] for point in summary["history"]] == [3, 6, 9]
    assert [point["learning_rate"] for point in summary["history"]] == pytest.approx(scheduled_rates(summary))


def reference_metrics(model, dataset) -> dict:
    """Today's figures computed the way they were before the masked-positions head: full logits everywhere."""
    loss_sum = tokens = correct = 0.0
    sample_losses, sample_tokens = [], []
    for batch in dataset:
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"], training=False).logits
        masked = batch["labels"] >= 0
        labels = tf.where(masked, batch["labels"], 0)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        weights = tf.cast(masked, tf.float32)
        sample_losses += tf.reduce_sum(losses * weights, axis=1).numpy().tolist()
        sample_tokens += tf.reduce_sum(weights, axis=1).numpy().tolist()
        loss_sum += float(tf.reduce_sum(losses * weights))
        tokens += float(tf.reduce_sum(weights))
        correct += float(
            tf.reduce_sum(tf.cast(tf.argmax(logits, -1, output_type=labels.dtype) == labels, tf.float32) * weights)
        )
    # the loss's standard error over samples: a ratio of means, its variance by the delta method
    per_sample, weight = np.array(sample_losses), np.array(sample_tokens)
    ratio, n = per_sample.sum() / weight.sum(), len(per_sample)
    standard_error = np.sqrt(np.var(per_sample - ratio * weight, ddof=1) * n) / weight.sum()
    return {
        "loss": loss_sum / tokens,
        "loss_standard_error": standard_error,
        "masked_accuracy": correct / tokens,
        "masked_tokens": int(tokens),
    }


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_masked_positions_metrics_equal_the_full_logits_metrics_on_the_same_masks(embedded_shards):
    manifest = read_manifest(embedded_shards["validation"])
    tf.keras.utils.set_random_seed(3)
    model = TFAutoModelForMaskedLM.from_config(model_config("tiny", manifest))
    stream = functools.partial(
        evaluation_dataset, embedded_shards["validation"], manifest, 20, Masking.from_manifest(manifest)
    )
    score = MaskedLMScorer(model, tf.distribute.get_strategy(), max_predictions(manifest["max_length"], 0.15))
    metrics = score(stream)
    expected = reference_metrics(model, stream())
    assert metrics["masked_tokens"] == expected["masked_tokens"] > 0
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    # an untrained model's samples lose nearly alike: their spread is a small difference of large float32 sums
    assert metrics["loss_standard_error"] == pytest.approx(expected["loss_standard_error"], rel=1e-2)
    assert metrics["masked_accuracy"] == pytest.approx(expected["masked_accuracy"], abs=1e-9)
    assert metrics["samples"] == manifest["num_records"] and metrics["batches"] == -(-manifest["num_records"] // 20)
    assert score(stream) == metrics  # the same function again, the same figures
    first_batch = score(stream, max_batches=1)
    assert first_batch["batches"] == 1
    assert first_batch["loss_standard_error"] > metrics["loss_standard_error"] > 0  # fewer samples, less precise
    assert score.traces == 1  # one graph for every pass: no compile per checkpoint


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_four_replicas_train_with_the_recipe_s_schedules_and_the_model_scores_the_same_at_eight_replicas_as_at_one(
    tmp_path, embedded_shards
):
    """A run on 4 replicas with accumulation: the recipe's schedules by optimizer step (the learning rate's
    warmup-stable-decay, the masking rate's decay from 30% to 15% over the 12 steps' 24 micro-batches), the
    gradient clipped, validating on every replica at each checkpoint. Its model then scores the same at 8 replicas
    as at 1. (The whole pipeline of tests/test_hub_datasets.py trains at 4 replicas too: a training at 8, as many
    as a v3-8's, takes the same MirroredStrategy path and about twice as long as at 4 here.
    Resumes: after a SIGKILL on gs:// in tests/test_train.py, after a
    SIGTERM at 2 replicas above, the masking stream from a checkpoint's micro-batch in tests/test_recipe.py.)"""
    output = str(tmp_path / "model")
    command = train_command(embedded_shards, output, "--replicas", "4", "--per_replica_batch_size", "4")
    command += ["--gradient_accumulation_steps", "2", "--learning_rate", "1e-3", "--warmup_steps", "2"]
    command += ["--lr_schedule", "wsd", "--decay_fraction", "0.5", "--mlm_probability", "0.3"]
    command += ["--final_mlm_probability", "0.15", "--clip_norm", "0.5"]  # clipping the gradient summed over replicas
    command += ["--max_steps", "12", "--checkpoint_every_steps", "4", "--log_every_steps", "4", "--eval_batches", "1"]
    trained = run_module(*command)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "4 CPU replicas (logical devices) under MirroredStrategy" in trained.stderr
    summary = json.loads(storage.read_text(f"{output}/{SUMMARY_FILE}"))
    assert summary["replicas"] == 4 and summary["global_batch_size"] == 32
    assert summary["arguments"]["clip_norm"] == 0.5 and all(point["loss"] > 0 for point in summary["history"])
    assert tf.train.latest_checkpoint(f"{output}/checkpoints").endswith("ckpt-12")
    assert storage.exists(f"{output}/tf_model.h5")
    history = summary["history"]
    assert [point["step"] for point in history] == [4, 8, 12]
    # stable at the peak until step 6, then linear to 0 at step 12; the masking rate of the batch after each point
    assert [point["learning_rate"] for point in history] == pytest.approx([1e-3, 1e-3 * 4 / 6, 0.0], abs=1e-9)
    assert [point["mlm_probability"] for point in history] == pytest.approx([0.25, 0.2, 0.15], abs=1e-6)
    # the validation of each checkpoint, on 4 replicas, with the log point of its step
    assert ["eval_loss" in point for point in history] == [True, True, True]
    assert trained.stderr.count("validation loss") == 3

    samples = read_manifest(embedded_shards["validation"])["num_records"]
    batch = samples - 3  # the last batch holds 3 samples: five of the eight replicas get none of it
    results = {}
    for replicas in (1, 8):
        evaluation = tmp_path / f"evaluation-{replicas}"
        evaluated = run_module(
            "components.evaluate",
            *("--model", output, "--shards", embedded_shards["validation"], "--output", str(evaluation)),
            *("--accelerator", "cpu", "--replicas", str(replicas), "--batch_size", str(batch), "--fill_mask", ""),
        )
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        results[replicas] = json.loads((evaluation / "metrics.json").read_text())
    one, eight = results[1], results[8]
    assert eight["samples"] == one["samples"] == samples and eight["batches"] == one["batches"] == 2
    assert eight["masked_tokens"] == one["masked_tokens"]
    assert eight["masked_accuracy"] == one["masked_accuracy"]
    assert eight["loss"] == pytest.approx(one["loss"], rel=1e-6)
