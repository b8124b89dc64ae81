"""Is the model any good? Fine-tune it on labelled classification tasks, and its randomly initialised twin (the same
config) the same way, and score both on each task's validation split: what pre-training gained.

Each task (``lib/downstream_tasks.py``: the built-in ``word-order``, a Hub dataset such as GLUE's, or a folder of
labelled files) is fine-tuned with the same budget and seeds for both models: a classification head on the
encoder (``TFAutoModelForSequenceClassification``), AdamW with warmup and linear decay, a few epochs. The
validation split is only scored, never trained on or tuned on. Writes ``downstream.json`` and ``report.md``.

    python -m components.downstream --model runs/.../train-step/model --tasks word-order --output /tmp/downstream
"""

from __future__ import annotations

import json
import logging
import math
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.downstream_tasks import METRICS, Task, TaskSelection, published_score
from components.lib.errors import InvalidParameter
from components.lib.estimates import PROBE_FINE_TUNING, fine_tuning_steps
from components.lib.job_runner import run_job
from components.lib.probe_baselines import baseline_predictions, score_error
from components.lib.pytorch_weights import TF_LOADING, check_model_folder
from components.lib.results import (
    DOWNSTREAM_FILE,
    PROBE_MODELS,
    REPORT_FILE,
    baselines_line,
    downstream_table,
    shown_score,
)

log = logging.getLogger("tpu_mlm.downstream")


@dataclass
class DownstreamArguments(TaskSelection):
    model: str = field(metadata={"help": "Model folder from components.train (local or gs://)."})
    output: str = field(metadata={"help": "Folder for downstream.json and report.md."})
    # the fine-tuning's defaults are the estimate's too (PROBE_FINE_TUNING): the estimate counts what runs
    epochs: int = field(
        default=PROBE_FINE_TUNING["epochs"], metadata={"help": "Passes over each task's training split."}
    )
    max_steps: int = field(
        default=PROBE_FINE_TUNING["max_steps"],
        metadata={"help": "Optimizer steps per task and seed; overrides epochs if > 0."},
    )
    max_train_samples: int = field(
        default=PROBE_FINE_TUNING["max_train_samples"],
        metadata={"help": "Fine-tune on at most this many samples; 0: all."},
    )
    max_eval_samples: int = field(
        default=PROBE_FINE_TUNING["max_eval_samples"], metadata={"help": "Score at most this many samples; 0: all."}
    )
    batch_size: int = field(default=PROBE_FINE_TUNING["batch_size"], metadata={"help": "Samples per fine-tuning step."})
    learning_rate: float = field(
        default=2e-5, metadata={"help": "Peak learning rate of fine-tuning (RoBERTa's GLUE runs: 1e-5 to 3e-5)."}
    )
    random_init_learning_rate: float = field(
        default=0.0,
        metadata={
            "help": "Peak learning rate of the random twin's fine-tuning; 0: learning_rate. A model trained from "
            "scratch wants more than a pre-trained one: a rate too low for it overstates the gain."
        },
    )
    warmup_fraction: float = field(default=0.06, metadata={"help": "Share of the steps of linear warmup."})
    weight_decay: float = field(default=0.1, metadata={"help": "Decoupled weight decay (RoBERTa's GLUE runs: 0.1)."})
    max_length: int = field(default=0, metadata={"help": "Tokens per sample; 0: the length the model trained at."})
    seeds: str = field(
        default=PROBE_FINE_TUNING["seeds"],
        metadata={"help": "Comma-separated seeds; each model fine-tunes once a seed."},
    )

    def __post_init__(self) -> None:
        for parameter in ("model", "output"):
            storage.check_uri(parameter, getattr(self, parameter))
        if not self.task_specs():
            raise InvalidParameter("tasks", self.tasks, "name at least one task")
        for parameter in ("epochs", "batch_size"):
            if getattr(self, parameter) < 1:
                raise InvalidParameter(parameter, getattr(self, parameter), "must be a positive whole number")
        for parameter in ("max_steps", "max_train_samples", "max_eval_samples", "max_length"):
            if getattr(self, parameter) < 0:
                raise InvalidParameter(parameter, getattr(self, parameter), "must be 0 or a positive whole number")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise InvalidParameter("learning_rate", self.learning_rate, "must be a positive number (2e-5 is usual)")
        if not (self.random_init_learning_rate >= 0 and math.isfinite(self.random_init_learning_rate)):
            raise InvalidParameter(
                "random_init_learning_rate", self.random_init_learning_rate, "must be 0 (learning_rate) or positive"
            )
        if not 0 <= self.warmup_fraction < 1:
            raise InvalidParameter("warmup_fraction", self.warmup_fraction, "must be at least 0 and below 1")
        if self.weight_decay < 0:
            raise InvalidParameter("weight_decay", self.weight_decay, "must be 0 or positive")
        if not re.fullmatch(r"\d+(,\d+)*", self.seeds.replace(" ", "")):
            raise InvalidParameter("seeds", self.seeds, "must be comma-separated whole numbers (1,2,3)")

    @property
    def seed_list(self) -> list[int]:
        return [int(seed) for seed in self.seeds.split(",")]


def scores(predicted: Sequence[int], labels: Sequence[int], classes: int) -> dict[str, float]:
    """Accuracy, F1 (of class 1 with two classes, else the mean over the classes that occur in the labels or the
    predictions, as scikit-learn's macro F1) and Matthews correlation."""
    import numpy as np

    confusion = np.zeros((classes, classes))
    np.add.at(confusion, (np.asarray(labels), np.asarray(predicted)), 1)
    total, correct = confusion.sum(), np.trace(confusion)
    predicted_counts, true_counts = confusion.sum(axis=0), confusion.sum(axis=1)
    precision = np.divide(np.diag(confusion), predicted_counts, out=np.zeros(classes), where=predicted_counts > 0)
    recall = np.diag(confusion) / np.maximum(true_counts, 1)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros(classes), where=both > 0)
    # Gorodkin's multi-class form, the binary MCC for two classes
    covariance = correct * total - predicted_counts @ true_counts
    scale = math.sqrt((total**2 - predicted_counts @ predicted_counts) * (total**2 - true_counts @ true_counts))
    occurring = (predicted_counts + true_counts) > 0
    return {
        "accuracy": float(correct / total),
        "f1": float(f1[1] if classes == 2 else f1[occurring].mean()),
        "mcc": float(covariance / scale) if scale else 0.0,
    }


@dataclass
class EncodedTask:
    """A task's splits as the model's token ids, each split padded to its longest sample (at most max_length)."""

    task: Task
    train: dict[str, Any]
    validation: dict[str, Any]
    train_tokens: list[list[int]]  # each sample's tokens, special ones left out: what the baselines read
    validation_tokens: list[list[int]]


def encode_task(model_dir: Path, task: Task, max_length: int) -> EncodedTask:
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # RoBERTa's positions start after the padding id: two fewer than its position table holds
    longest = AutoConfig.from_pretrained(model_dir).max_position_embeddings - 2
    if max_length > longest:
        raise InvalidParameter("max_length", max_length, f"must be at most {longest}, the model's longest input")
    max_length = max_length or min(tokenizer.model_max_length, longest)

    def encoded(texts: list[tuple[str, ...]]) -> dict[str, Any]:
        columns = [list(column) for column in zip(*texts, strict=True)]
        tokens = tokenizer(*columns, truncation=True, max_length=max_length, padding="longest", return_tensors="np")
        return {name: tokens[name].astype("int32") for name in ("input_ids", "attention_mask")}

    special = set(tokenizer.all_special_ids)

    def tokens(encoded_split: dict[str, Any]) -> list[list[int]]:
        return [
            [int(token) for token, kept in zip(ids, mask, strict=True) if kept and token not in special]
            for ids, mask in zip(encoded_split["input_ids"], encoded_split["attention_mask"], strict=True)
        ]

    train, validation = encoded(task.train.texts), encoded(task.validation.texts)
    return EncodedTask(task, train, validation, tokens(train), tokens(validation))


def task_score_error(task: Task, predicted: Sequence[int]) -> float:
    """The sampling error of the task's metric for these predictions of its scored split."""
    classes = len(task.label_names)
    return score_error(
        task.metric, lambda p, labels: scores(p, labels, classes)[task.metric], predicted, task.validation.labels
    )


def fine_tune(
    model_dir: Path, encoded: EncodedTask, arguments: DownstreamArguments, seed: int, pretrained: bool
) -> dict:
    """One fine-tuning of the pre-trained model (or of a new one of its config) on a task: its validation scores."""
    import numpy as np
    import tensorflow as tf
    from transformers import AutoConfig, TFAutoModelForSequenceClassification, create_optimizer

    tf.keras.utils.set_random_seed(seed)  # the head's initialisation (and the twin's weights), the batches' order
    task = encoded.task
    config = AutoConfig.from_pretrained(model_dir, num_labels=len(task.label_names))
    if pretrained:  # the encoder's weights; the LM head is dropped, the classification head is new
        model = TFAutoModelForSequenceClassification.from_pretrained(model_dir, config=config, **TF_LOADING)
    else:
        model = TFAutoModelForSequenceClassification.from_config(config)
    samples = len(task.train.labels)
    batch_size = min(arguments.batch_size, samples)
    steps = fine_tuning_steps(samples, arguments.batch_size, arguments.epochs, arguments.max_steps)
    learning_rate = (
        arguments.learning_rate if pretrained else arguments.random_init_learning_rate or arguments.learning_rate
    )
    optimizer, _ = create_optimizer(
        init_lr=learning_rate,
        num_train_steps=steps,
        num_warmup_steps=int(arguments.warmup_fraction * steps),
        weight_decay_rate=arguments.weight_decay,
    )
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    train = tf.data.Dataset.from_tensor_slices((encoded.train, np.asarray(task.train.labels)))
    train = train.shuffle(samples, seed=seed).repeat().batch(batch_size, drop_remainder=True)
    started = time.perf_counter()
    history = model.fit(train, steps_per_epoch=steps, epochs=1, verbose=0)
    logits = model.predict(encoded.validation, batch_size=arguments.batch_size, verbose=0).logits
    if not (math.isfinite(history.history["loss"][-1]) and np.isfinite(logits).all()):
        raise FloatingPointError(
            f"{task.name}: the {'pre-trained' if pretrained else 'random init'} model's fine-tuning (seed {seed}) "
            f"diverged: its loss or logits are not finite; try a lower learning rate than {learning_rate:g}"
        )
    predicted = np.argmax(logits, axis=-1)
    return {
        **scores(predicted, task.validation.labels, len(task.label_names)),
        "standard_error": task_score_error(task, predicted),
        "steps": steps,
        "mean_train_loss": float(history.history["loss"][-1]),  # over all the steps (one Keras epoch)
        "seconds": round(time.perf_counter() - started, 3),
    }


def downstream(arguments: DownstreamArguments) -> dict[str, Any]:
    """Fine-tunes and scores both models on every task; writes downstream.json and report.md; returns the results."""
    specs = arguments.task_specs()
    check_model_folder("model", arguments.model)
    tasks = [spec.load(arguments.max_train_samples, arguments.max_eval_samples) for spec in specs]  # bad input first
    results = []
    with tempfile.TemporaryDirectory() as local:
        storage.download_folder(arguments.model, Path(local))
        encoded = [encode_task(Path(local), task, arguments.max_length) for task in tasks]  # refusals first
        for task, tokens in zip(tasks, encoded, strict=True):
            seeds = arguments.seed_list
            runs = {
                model: [fine_tune(Path(local), tokens, arguments, seed, model == PROBE_MODELS[0]) for seed in seeds]
                for model in PROBE_MODELS
            }
            result = task_result(task, runs, tokens)
            log.info(
                "%s: %s %s pre-trained, %s random init, majority class %.4f (validation, %d samples, %d seed(s))",
                task.name,
                task.metric,
                shown_score(result["pre-trained"]),
                shown_score(result["random init"]),
                result["baselines"]["majority class"],
                result["validation_samples"],
                len(arguments.seed_list),
            )
            results.append(result)
    summary = {
        "tasks": results,
        # each task's own metric, averaged over the tasks (GLUE's score averages F1 and accuracy where it reports
        # both: MRPC and QQP count F1 alone here)
        "average": {model: statistics.mean(result[model]["score"] for result in results) for model in PROBE_MODELS},
        "arguments": asdict(arguments),
    }
    storage.write_text_atomic(storage.join(arguments.output, REPORT_FILE), report_markdown(summary))
    storage.write_text_atomic(storage.join(arguments.output, DOWNSTREAM_FILE), json.dumps(summary, indent=2) + "\n")
    return summary


def task_result(task: Task, runs: dict[str, list[dict[str, Any]]], tokens: EncodedTask) -> dict[str, Any]:
    """A task's figures: each model's mean over the seeds of each score, its task metric's as ``score``, each seed's,
    their spread and the score's sampling error; the trivial baselines' scores on the same split; and whether each
    model beat always answering the majority class by more than its error (else: "no signal")."""
    classes, labels = len(task.label_names), task.validation.labels
    baselines = {
        name: scores(predicted, labels, classes)[task.metric]
        for name, predicted in baseline_predictions(
            tokens.train_tokens, task.train.labels, tokens.validation_tokens, classes
        ).items()
    }
    result: dict[str, Any] = {
        "task": task.name,
        "metric": task.metric,
        "labels": list(task.label_names),
        "train_samples": len(task.train.labels),
        "validation_samples": len(task.validation.labels),
        "validation_split": task.validation_split,
        "published": published_score(task.name),  # roberta-base's, after a full fine-tune: not comparable
        # the share of the scored split's most frequent label, and the trivial baselines' scores in the task's metric
        "majority_class": max(labels.count(label) for label in set(labels)) / len(labels),
        "baselines": baselines,
    }
    for model, model_runs in runs.items():
        means = {name: statistics.mean(run[name] for run in model_runs) for name in METRICS}
        seed_scores = [run[task.metric] for run in model_runs]
        error = statistics.mean(run["standard_error"] for run in model_runs)
        result[model] = {
            **means,
            "score": means[task.metric],
            "seed_scores": seed_scores,
            "seed_std": statistics.stdev(seed_scores) if len(seed_scores) > 1 else 0.0,
            "standard_error": error,
            "signal": means[task.metric] - baselines["majority class"] > error,
            "runs": model_runs,
        }
    result["gain"] = result[PROBE_MODELS[0]]["score"] - result[PROBE_MODELS[1]]["score"]
    return result


def report_markdown(summary: dict[str, Any]) -> str:
    seeds = summary["arguments"]["seeds"]
    intro = (
        "Each task fine-tuned from the pre-trained model and from a randomly initialised twin (the same config, the "
        f"same budget, seeds {seeds}), scored on its validation split (never trained or tuned on)."
    )
    return "\n".join(["# Downstream probe", "", intro, "", *downstream_table(summary)]) + "\n"


def summary_for_people(summary: dict[str, Any]) -> str:
    lines = [
        f"{result['task']}: {result['metric']} {shown_score(result['pre-trained'])} pre-trained against "
        f"{shown_score(result['random init'])} from random weights; trivial baselines: {baselines_line(result)}"
        for result in summary["tasks"]
    ]
    return "\n".join([*lines, f"downstream.json and report.md: {summary['arguments']['output']}"])


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(DownstreamArguments, downstream, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
