"""Is the model any good? Fine-tune it on labelled classification tasks, and its randomly initialised twin (the same
config) the same way, and score both on each task's validation split: what pre-training gained. A model continued
from another (``--init_from``) has a third: that base model as it was, fine-tuned the same way: what adapting it
gained.

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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.downstream_tasks import METRICS, Examples, Task, TaskSelection, published_score, split_off
from components.lib.errors import InvalidParameter, first_line
from components.lib.estimates import PROBE_FINE_TUNING, dev_samples, fine_tuning_steps, fine_tunings, probe_grids
from components.lib.hub import HubToken, check_secret_name
from components.lib.job_runner import run_job
from components.lib.probe_baselines import baseline_predictions, score_error
from components.lib.pytorch_weights import TF_LOADING, check_model_folder
from components.lib.results import (
    BASE_MODEL,
    DOWNSTREAM_FILE,
    PROBE_MODELS,
    REPORT_FILE,
    SUMMARY_FILE,
    baselines_line,
    downstream_table,
    shown_score,
)

log = logging.getLogger("tpu_mlm.downstream")


@dataclass
class DownstreamArguments(HubToken, TaskSelection):
    model: str = field(metadata={"help": "Model folder from components.train (local or gs://)."})
    output: str = field(metadata={"help": "Folder for downstream.json and report.md."})
    # the fine-tuning's defaults are the estimate's too (PROBE_FINE_TUNING): the estimate counts what runs
    epochs: int = field(
        default=PROBE_FINE_TUNING["epochs"], metadata={"help": "Passes over each task's training split."}
    )
    min_steps: int = field(
        default=PROBE_FINE_TUNING["min_steps"],
        metadata={"help": "Optimizer steps per task and seed at least, however few epochs that is."},
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
    learning_rates: str = field(
        default=PROBE_FINE_TUNING["learning_rates"],
        metadata={
            "help": "Peak learning rates of fine-tuning, comma-separated: each model's is the one of them that "
            "scores best on a development split carved from the task's training split, never on the scored split "
            "(roberta-base learns at 1e-5 to 3e-5, a small model at about 1e-3)."
        },
    )
    random_init_learning_rates: str = field(
        default=PROBE_FINE_TUNING["random_init_learning_rates"],
        metadata={
            "help": "The random twin's rates to choose from; empty: learning_rates. A model trained from scratch "
            "often wants a higher rate than a pre-trained one: a rate too low for it overstates the gain."
        },
    )
    dev_fraction: float = field(
        default=PROBE_FINE_TUNING["dev_fraction"],
        metadata={
            "help": "Share of each task's training split set aside as the development split the rates are chosen "
            "on (none with one rate each)."
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
        for parameter in ("min_steps", "max_steps", "max_train_samples", "max_eval_samples", "max_length"):
            if getattr(self, parameter) < 0:
                raise InvalidParameter(parameter, getattr(self, parameter), "must be 0 or a positive whole number")
        probe_grids(self.learning_rates, self.random_init_learning_rates)  # each rate checked
        if not 0 < self.dev_fraction < 1:
            raise InvalidParameter("dev_fraction", self.dev_fraction, "must be above 0 and below 1 (0.2 is usual)")
        if not 0 <= self.warmup_fraction < 1:
            raise InvalidParameter("warmup_fraction", self.warmup_fraction, "must be at least 0 and below 1")
        if self.weight_decay < 0:
            raise InvalidParameter("weight_decay", self.weight_decay, "must be 0 or positive")
        if not re.fullmatch(r"\d+(,\d+)*", self.seeds.replace(" ", "")):
            raise InvalidParameter("seeds", self.seeds, "must be comma-separated whole numbers (1,2,3)")
        if self.hf_token_secret:  # a continued model's private base, read for the probe's third model
            check_secret_name(self.hf_token_secret)

    @property
    def seed_list(self) -> list[int]:
        return [int(seed) for seed in self.seeds.split(",")]

    @property
    def grids(self) -> dict[str, list[float]]:
        """Each probe model's learning rates to choose from: a base model, pre-trained, the pre-trained's."""
        pretrained, random_init = probe_grids(self.learning_rates, self.random_init_learning_rates)
        return {PROBE_MODELS[0]: pretrained, PROBE_MODELS[1]: random_init, BASE_MODEL: pretrained}


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
class ScoredSplit:
    """A held-out split the fine-tuned models are scored on: its examples, their inputs, their tokens."""

    examples: Examples
    inputs: dict[str, Any]
    tokens: list[list[int]]  # each sample's tokens, special ones left out: what the baselines read


@dataclass
class EncodedTask:
    """A task's splits as the model's token ids, each split padded to its longest sample (at most max_length)."""

    task: Task  # its train split is what the models fine-tune on: the development split is carved off it
    dev: Examples  # where each model's learning rate is chosen: empty when both models have one rate
    inputs: dict[str, dict[str, Any]]  # "train" and "dev": input_ids and attention_mask
    train_tokens: list[list[int]]
    scored: dict[str, ScoredSplit]  # by split name: the task's validation split first, then its also_scored


def encode_task(model_dir: Path, task: Task, dev: Examples, max_length: int) -> EncodedTask:
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # RoBERTa's positions start after the padding id: two fewer than its position table holds
    longest = AutoConfig.from_pretrained(model_dir).max_position_embeddings - 2
    if max_length > longest:
        raise InvalidParameter("max_length", max_length, f"must be at most {longest}, the model's longest input")
    max_length = max_length or min(tokenizer.model_max_length, longest)

    def encoded(texts: list[tuple[str, ...]]) -> dict[str, Any]:
        if not texts:
            return {}
        columns = [list(column) for column in zip(*texts, strict=True)]
        tokens = tokenizer(*columns, truncation=True, max_length=max_length, padding="longest", return_tensors="np")
        return {name: tokens[name].astype("int32") for name in ("input_ids", "attention_mask")}

    special = set(tokenizer.all_special_ids)

    def tokens(encoded_split: dict[str, Any]) -> list[list[int]]:
        return [
            [int(token) for token, kept in zip(ids, mask, strict=True) if kept and token not in special]
            for ids, mask in zip(encoded_split["input_ids"], encoded_split["attention_mask"], strict=True)
        ]

    inputs = {"train": encoded(task.train.texts), "dev": encoded(dev.texts)}
    scored = {}
    for split, examples in {task.validation_split: task.validation, **task.also_scored}.items():
        split_inputs = encoded(examples.texts)
        scored[split] = ScoredSplit(examples, split_inputs, tokens(split_inputs))
    return EncodedTask(task, dev, inputs, tokens(inputs["train"]), scored)


def task_score_error(task: Task, predicted: Sequence[int], labels: Sequence[int]) -> float:
    """The sampling error of the task's metric for these predictions of a scored split."""
    classes = len(task.label_names)
    return score_error(task.metric, lambda p, truth: scores(p, truth, classes)[task.metric], predicted, labels)


# the config's dropout rates (RoBERTa's and BERT's; the classification head's, unset, is the hidden one's)
DROPOUTS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")


def fine_tune(
    model_dir: Path,
    encoded: EncodedTask,
    arguments: DownstreamArguments,
    seeds: Sequence[int],
    model_name: str,
    learning_rate: float,
    score_dev: bool = False,
) -> list[dict]:
    """The probe's ``model_name`` (the weights in ``model_dir``, or for the random twin a new model of their config)
    fine-tuned on a task at a peak learning rate, once a seed: each run's scores on each scored split, and its
    development split's score in the task's metric if asked (``dev_score``).

    A model without dropout (make run's ``mini``) fine-tunes every seed on one compiled Keras model and optimizer,
    whose weights and state each run sets anew: TensorFlow traces the training and prediction functions once a call,
    not once a seed (about 3 s a run of make run's probe here). With dropout, each seed has a model of its own:
    dropout's masks are drawn in the traced function, whose random stream would run on from one seed's run to the
    next. Either way a seed's run is the one it is alone: the seed decides its head (and the twin's weights), its
    dropout and its batches' order."""
    import tensorflow as tf
    from transformers import AutoConfig, TFAutoModelForSequenceClassification, create_optimizer

    task = encoded.task
    classes = len(task.label_names)
    config = AutoConfig.from_pretrained(model_dir, num_labels=classes)

    def new_model() -> Any:
        if model_name != PROBE_MODELS[1]:  # the encoder's weights; the LM head is dropped, the head is new
            return TFAutoModelForSequenceClassification.from_pretrained(model_dir, config=config, **TF_LOADING)
        model = TFAutoModelForSequenceClassification.from_config(config)
        model(model.dummy_inputs, training=False)  # its weights, drawn now
        return model

    shared = not any(getattr(config, name, 0) for name in DROPOUTS)
    samples = len(task.train.labels)
    steps = fine_tuning_steps(samples, arguments.batch_size, arguments.epochs, arguments.max_steps, arguments.min_steps)
    model = None
    runs = []
    for seed in seeds:
        tf.keras.utils.set_random_seed(seed)  # the head's initialisation (and the twin's weights), the batches' order
        if model is None or not shared:
            model = new_model()
            optimizer, _ = create_optimizer(
                init_lr=learning_rate,
                num_train_steps=steps,
                num_warmup_steps=int(arguments.warmup_fraction * steps),
                weight_decay_rate=arguments.weight_decay,
            )
            model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        else:  # this seed's weights, and the optimizer as new: its step count (the schedule's) and moments at 0
            model.set_weights(new_model().get_weights())
            for variable in model.optimizer.variables():
                variable.assign(tf.zeros_like(variable))
        runs.append(trained_run(model, encoded, arguments, seed, model_name, learning_rate, steps, score_dev))
    return runs


def trained_run(
    model: Any,
    encoded: EncodedTask,
    arguments: DownstreamArguments,
    seed: int,
    model_name: str,
    learning_rate: float,
    steps: int,
    score_dev: bool,
) -> dict[str, Any]:
    """One fine-tuning of a compiled ``model`` (``fine_tune``'s, its weights set for ``seed``) and its scores."""
    import numpy as np
    import tensorflow as tf

    task = encoded.task
    samples = len(task.train.labels)
    train = tf.data.Dataset.from_tensor_slices((encoded.inputs["train"], np.asarray(task.train.labels)))
    train = train.shuffle(samples, seed=seed).repeat().batch(min(arguments.batch_size, samples), drop_remainder=True)
    started = time.perf_counter()
    history = model.fit(train, steps_per_epoch=steps, epochs=1, verbose=0)
    train_loss = float(history.history["loss"][-1])  # over all the steps (one Keras epoch)

    def predicted(inputs: dict[str, Any]) -> Any:
        logits = model.predict(inputs, batch_size=arguments.batch_size, verbose=0).logits
        if not (math.isfinite(train_loss) and np.isfinite(logits).all()):
            raise FloatingPointError(
                f"{task.name}: the {model_name} model's fine-tuning (seed {seed}) "
                f"diverged: its loss or logits are not finite; try a lower learning rate than {learning_rate:g}"
            )
        return np.argmax(logits, axis=-1)

    classes = len(task.label_names)
    run: dict[str, Any] = {"learning_rate": learning_rate, "steps": steps, "scored": {}}
    for split, part in encoded.scored.items():
        split_predictions = predicted(part.inputs)
        run["scored"][split] = {
            **scores(split_predictions, part.examples.labels, classes),
            "standard_error": task_score_error(task, split_predictions, part.examples.labels),
        }
    if score_dev and encoded.dev.labels:
        run["dev_score"] = scores(predicted(encoded.inputs["dev"]), encoded.dev.labels, classes)[task.metric]
    run["mean_train_loss"] = train_loss
    run["seconds"] = round(time.perf_counter() - started, 3)
    return run


def tuned_runs(
    model_dir: Path, encoded: EncodedTask, arguments: DownstreamArguments, model: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A probe model's fine-tunings on a task: with several rates, one at each with the first seed, scored on the
    development split, the best of them kept; then one for each other seed at that rate. Returns the kept runs (one
    a seed) and the search (each rate's development score; None where it diverged)."""
    grid, seeds = arguments.grids[model], arguments.seed_list
    if len(grid) == 1:
        return fine_tune(model_dir, encoded, arguments, seeds, model, grid[0]), []
    name, metric = encoded.task.name, encoded.task.metric
    search, first = [], {}
    for rate in grid:
        try:
            (first[rate],) = fine_tune(model_dir, encoded, arguments, seeds[:1], model, rate, score_dev=True)
        except FloatingPointError as error:
            log.warning("%s", error)
            search.append({"learning_rate": rate, "dev_score": None})
            continue
        search.append({"learning_rate": rate, "dev_score": first[rate]["dev_score"]})
        log.info(
            "%s, %s: rate %g, %s %.4f on the development split", name, model, rate, metric, search[-1]["dev_score"]
        )
    rate = chosen_rate(search, f"{name}: the {model} model's fine-tuning")
    others = fine_tune(model_dir, encoded, arguments, seeds[1:], model, rate) if seeds[1:] else []
    return [first[rate], *others], search


def chosen_rate(search: list[dict[str, Any]], what: str) -> float:
    """The rate of the search's best development score (the first of equals, in the grid's order)."""
    scored = [point for point in search if point["dev_score"] is not None]
    if not scored:
        rates = ", ".join(f"{point['learning_rate']:g}" for point in search)
        raise FloatingPointError(f"{what} diverged at every rate ({rates}): its loss or logits are not finite")
    return max(scored, key=lambda point: point["dev_score"])["learning_rate"]


def encode_for_probe(model_dir: Path, task: Task, arguments: DownstreamArguments) -> EncodedTask:
    """A task's splits encoded, its development split carved from training when a model has several rates."""
    most_rates = max(len(grid) for grid in arguments.grids.values())
    train, dev = split_off(task.train, dev_samples(len(task.train.labels), arguments.dev_fraction, most_rates))
    return encode_task(model_dir, replace(task, train=train), dev, arguments.max_length)


def probe_task(folders: dict[str, Path], encoded: EncodedTask, arguments: DownstreamArguments) -> list[dict[str, Any]]:
    """The models' fine-tunings on a task (``folders``: each one's weights, ``probe_folders``), each at its chosen
    rate: the task's figures on each split it is scored on (``task_result``; MNLI's two)."""
    task = encoded.task
    log.info(
        "%s: %d fine-tunings of %d samples, %d development samples to choose the rates on",
        task.name,
        sum(fine_tunings(len(arguments.grids[model]), len(arguments.seed_list)) for model in folders),
        len(task.train.labels),
        len(encoded.dev.labels),
    )
    tuned = {model: tuned_runs(folder, encoded, arguments, model) for model, folder in folders.items()}
    return [task_result(encoded, tuned, split) for split in encoded.scored]


def probe_folders(model_dir: Path, work: Path, secret: str = "") -> tuple[dict[str, Path], str]:
    """Each probe model's folder: the trained model's, for it and its random twin (its config); and for a model
    continued from another (its summary's ``base_model``, at the commit it was read), that base as it was, saved
    as TensorFlow weights under ``work``. A base that cannot be read now is left out, not the probe: the reason is
    returned beside the folders ("" where there is none)."""
    from components.lib.base_model import base_model_token, check_base_model, load_base_weights

    folders = {PROBE_MODELS[0]: model_dir, PROBE_MODELS[1]: model_dir}
    summary = model_dir / SUMMARY_FILE
    trained = json.loads(summary.read_text()) if summary.exists() else {}
    # the commit it was read at; a model trained before that was recorded: its init_from as given
    base = trained.get("base_model") or trained.get("arguments", {}).get("init_from", "")
    if not base:
        return folders, ""
    try:
        token = base_model_token(base, secret)
        model = load_base_weights(base, check_base_model(base, token=token).config, token)
    except Exception as error:  # a base gone, or a copy of the model whose base is left out: two models still tell
        reason = f"The base model could not be read, so it is not probed ({type(error).__name__}: {first_line(error)})"
        log.warning("%s", reason)
        return folders, reason
    model.save_pretrained(work / "base", safe_serialization=False)
    return {**folders, BASE_MODEL: work / "base"}, ""


def downstream(arguments: DownstreamArguments) -> dict[str, Any]:
    """Fine-tunes and scores both models on every task; writes downstream.json and report.md; returns the results."""
    specs = arguments.task_specs()
    check_model_folder("model", arguments.model)
    tasks = [spec.load(arguments.max_train_samples, arguments.max_eval_samples) for spec in specs]  # bad input first
    results = []
    with tempfile.TemporaryDirectory() as local, tempfile.TemporaryDirectory() as work:
        storage.download_folder(arguments.model, Path(local))
        encoded = [encode_for_probe(Path(local), task, arguments) for task in tasks]  # refusals first
        folders, base_left_out = probe_folders(Path(local), Path(work), arguments.hf_token_secret)
        for task_inputs in encoded:
            for result in probe_task(folders, task_inputs, arguments):
                log.info(
                    "%s: %s %s, one class always %.4f (%s, %d samples, %d seed(s))",
                    result["task"],
                    result["metric"],
                    ", ".join(f"{shown_score(result[model])} {model}" for model in folders),
                    result["one_class"],
                    result["validation_split"],
                    result["validation_samples"],
                    len(arguments.seed_list),
                )
                results.append(result)
    summary = {
        "tasks": results,
        # each task's own metric, averaged over the tasks (a task scored on two splits, as MNLI, by their mean;
        # GLUE's score averages F1 and accuracy where it reports both: MRPC and QQP count F1 alone here)
        "average": {model: average_over_tasks(results, model) for model in folders},
        **({"base_left_out": base_left_out} if base_left_out else {}),
        "arguments": asdict(arguments),
    }
    storage.write_text_atomic(storage.join(arguments.output, REPORT_FILE), report_markdown(summary))
    storage.write_text_atomic(storage.join(arguments.output, DOWNSTREAM_FILE), json.dumps(summary, indent=2) + "\n")
    return summary


def average_over_tasks(results: list[dict[str, Any]], model: str) -> float:
    """A model's score averaged over the tasks, each task's over the splits it is scored on."""
    by_task: dict[str, list[float]] = {}
    for result in results:
        by_task.setdefault(result["task"], []).append(result[model]["score"])
    return statistics.mean(statistics.mean(split_scores) for split_scores in by_task.values())


def task_result(
    encoded: EncodedTask, tuned: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]], split: str
) -> dict[str, Any]:
    """A task's figures on one scored split: each model's rate and the search that chose it, its mean over the seeds
    of each score, its task metric's as ``score``, each seed's, their spread and the score's sampling error; the
    trivial baselines' scores on the same split; and whether each model beat always answering one class (the best of
    them on this split) by more than its error (else: "no signal")."""
    task, scored = encoded.task, encoded.scored[split]
    classes, labels = len(task.label_names), scored.examples.labels
    baselines = {
        name: scores(predicted, labels, classes)[task.metric]
        for name, predicted in baseline_predictions(
            encoded.train_tokens, task.train.labels, scored.tokens, classes
        ).items()
    }
    result: dict[str, Any] = {
        "task": task.name,
        "metric": task.metric,
        "labels": list(task.label_names),
        "train_samples": len(task.train.labels),
        "dev_samples": len(encoded.dev.labels),
        "validation_samples": len(labels),
        "validation_split": split,
        # roberta-base's, after a full fine-tune: not comparable; on the task's usual split only
        "published": published_score(task.name) if split == task.validation_split else None,
        # the share of the scored split's most frequent label, and the trivial baselines' scores in the task's metric
        "majority_class": max(labels.count(label) for label in set(labels)) / len(labels),
        # the best score of answering one class every time, whichever, in the task's metric (the majority's share
        # for accuracy, 0 for Matthews correlation): the score a model must beat to have learnt anything
        "one_class": max(scores([label] * len(labels), labels, classes)[task.metric] for label in range(classes)),
        "baselines": baselines,
    }
    for model, (tuned_model_runs, search) in tuned.items():
        model_runs = [
            {**{key: value for key, value in run.items() if key != "scored"}, **run["scored"][split]}
            for run in tuned_model_runs
        ]
        means = {name: statistics.mean(run[name] for run in model_runs) for name in METRICS}
        seed_scores = [run[task.metric] for run in model_runs]
        error = statistics.mean(run["standard_error"] for run in model_runs)
        result[model] = {
            **means,
            "score": means[task.metric],
            "learning_rate": model_runs[0]["learning_rate"],
            "learning_rate_search": search,  # empty with one rate: nothing chosen
            "seed_scores": seed_scores,
            "seed_std": statistics.stdev(seed_scores) if len(seed_scores) > 1 else 0.0,
            "standard_error": error,
            "signal": means[task.metric] - result["one_class"] > error,
            "runs": model_runs,
        }
    result["gain"] = result[PROBE_MODELS[0]]["score"] - result[PROBE_MODELS[1]]["score"]
    if BASE_MODEL in tuned:  # what continuing the base's pre-training on the corpus gained on this task
        result["adaptation_gain"] = result[PROBE_MODELS[0]]["score"] - result[BASE_MODEL]["score"]
    return result


def report_markdown(summary: dict[str, Any]) -> str:
    seeds = summary["arguments"]["seeds"]
    intro = (
        "Each task fine-tuned from the pre-trained model and from a randomly initialised twin (the same config, the "
        f"same budget, seeds {seeds}), scored on its validation split (never trained or tuned on)."
        + (
            " The model continued from a base: that base as it was is fine-tuned the same way (adaptation gain: the "
            "model's score minus the base's)."
            if BASE_MODEL in summary["average"]
            else ""
        )
        + (f" {summary['base_left_out']}." if summary.get("base_left_out") else "")
    )
    return "\n".join(["# Downstream probe", "", intro, "", *downstream_table(summary)]) + "\n"


def summary_for_people(summary: dict[str, Any]) -> str:
    lines = [
        f"{result['task']}: {result['metric']} {shown_score(result['pre-trained'])} pre-trained against "
        f"{shown_score(result['random init'])} from random weights"
        + (f", {shown_score(result[BASE_MODEL])} for the base as it was" if BASE_MODEL in result else "")
        + f"; trivial baselines: {baselines_line(result)}"
        for result in summary["tasks"]
    ]
    return "\n".join([*lines, f"downstream.json and report.md: {summary['arguments']['output']}"])


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(DownstreamArguments, downstream, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
