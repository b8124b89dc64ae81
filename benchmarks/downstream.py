"""The downstream probe's built-in task, and what its fine-tuning costs on a CPU.

1. Which negatives make a word-order task that tells a pre-trained model from its random twin: the embedded
   corpus's prose lines against the same lines reversed (the built-in task), with two neighbouring words swapped,
   or with all their words shuffled; each fine-tuned from the model and from a randomly initialised twin of its
   config on a few hundred lines and on all of them, the same seeds and budget, scored on the validation lines.
2. The model FLOP/s of a fine-tuning step of ``roberta-base`` (random weights, 32 samples of 128 tokens) and of
   the model the first part reads, on this machine: the rate the estimate prices the probe at.

    make run   # a model to probe: runs/<run>/train-step/model
    python benchmarks/downstream.py --model runs/<run>/train-step/model [--output benchmarks/results/downstream.json]
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from transformers import HfArgumentParser  # noqa: E402

from components.downstream import DownstreamArguments, encode_task, fine_tune  # noqa: E402
from components.lib.downstream_tasks import Examples, Task, reversed_words, word_order_task  # noqa: E402
from components.lib.results import PROBE_MODELS  # noqa: E402


@dataclass
class BenchmarkArguments:
    model: str = field(metadata={"help": "A pre-trained model folder (make run's: runs/<run>/train-step/model)."})
    train_sizes: str = field(default="256,0", metadata={"help": "Labelled lines to fine-tune on; 0: all."})
    seeds: str = field(default="1,2,3", metadata={"help": "Seeds of each fine-tuning."})
    max_steps: int = field(default=150, metadata={"help": "Steps of each fine-tuning."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate of both models."})
    rate_steps: int = field(default=3, metadata={"help": "roberta-base steps timed for the rate; 0: skip."})
    output: str = field(default="benchmarks/results/downstream.json", metadata={"help": "JSON results."})


def swapped_words(words: list[str], draw: random.Random) -> list[str] | None:
    at = draw.randrange(len(words) - 1)
    return None if words[at] == words[at + 1] else [*words[:at], words[at + 1], words[at], *words[at + 2 :]]


def shuffled_words(words: list[str], draw: random.Random) -> list[str] | None:
    shuffled = list(words)
    draw.shuffle(shuffled)
    return None if shuffled == words else shuffled


NEGATIVES = {"reversed": reversed_words, "swapped": swapped_words, "shuffled": shuffled_words}


def probe(arguments: BenchmarkArguments, task: Task, train_size: int) -> dict:
    """Both models fine-tuned on ``train_size`` lines (0: all) once a seed: each one's validation accuracy."""
    from components.lib.downstream_tasks import _head

    task = Task(task.name, task.metric, task.label_names, _head(task.train, train_size), task.validation)
    settings = DownstreamArguments(model=arguments.model, output="unused", max_steps=arguments.max_steps)
    encoded = encode_task(Path(arguments.model), task, Examples([], []), 0)
    seeds = [int(seed) for seed in arguments.seeds.split(",")]
    accuracy = {
        model: [
            fine_tune(
                Path(arguments.model), encoded, settings, seed, model == PROBE_MODELS[0], arguments.learning_rate
            )["scored"][task.validation_split]["accuracy"]
            for seed in seeds
        ]
        for model in PROBE_MODELS
    }
    means = {model: statistics.mean(values) for model, values in accuracy.items()}
    return {
        "train_samples": len(task.train.labels),
        "validation_samples": len(task.validation.labels),
        "accuracy": accuracy,
        "mean": means,
        "gain": means[PROBE_MODELS[0]] - means[PROBE_MODELS[1]],
        "pre_trained_ahead_on_every_seed": all(
            pre > twin for pre, twin in zip(accuracy[PROBE_MODELS[0]], accuracy[PROBE_MODELS[1]], strict=True)
        ),
    }


def fine_tuning_rate(config_overrides: dict, steps: int, batch: int = 32, length: int = 128) -> dict:
    """Model FLOP/s (the MFU's accounting: 6 a parameter and attention's, a token) of fine-tuning steps of a
    sequence classifier of the config, after one step that builds it; and of its scoring (a third of that a token)."""
    import numpy as np
    import tensorflow as tf
    from transformers import RobertaConfig, TFAutoModelForSequenceClassification, create_optimizer

    from components.lib.modeling import count_parameters
    from components.lib.run_shape import run_shape

    config = RobertaConfig(**config_overrides, num_labels=2)
    model = TFAutoModelForSequenceClassification.from_config(config)
    optimizer, _ = create_optimizer(init_lr=2e-5, num_train_steps=steps + 1, num_warmup_steps=0)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = np.random.default_rng(0).integers(5, config.vocab_size, size=(batch * (steps + 1), length), dtype="int32")
    inputs, labels = {"input_ids": ids, "attention_mask": np.ones_like(ids)}, ids[:, 0] % 2
    model.fit({k: v[:batch] for k, v in inputs.items()}, labels[:batch], batch_size=batch, verbose=0)
    started = time.perf_counter()
    model.fit({k: v[batch:] for k, v in inputs.items()}, labels[batch:], batch_size=batch, verbose=0)
    training = time.perf_counter() - started
    started = time.perf_counter()
    model.predict(inputs, batch_size=batch, verbose=0)
    scoring = time.perf_counter() - started
    shape = run_shape(
        per_replica_batch_size=batch, max_length=length, samples=None, max_steps=steps, replicas=1, config=config
    )
    per_token = shape.flops_per_token
    return {
        "parameters": count_parameters(config),
        "seconds_per_step": training / steps,
        "train_flops_per_second": per_token * batch * length * steps / training,
        "score_flops_per_second": per_token / 3 * len(ids) * length / scoring,
    }


def main() -> None:
    (arguments,) = HfArgumentParser(BenchmarkArguments, allow_abbrev=False).parse_args_into_dataclasses()
    results: dict = {"arguments": asdict(arguments), "cores": os.cpu_count(), "negatives": {}}
    for name, negative in NEGATIVES.items():
        task = word_order_task(negative)
        for size in (int(size) for size in arguments.train_sizes.split(",")):
            run = probe(arguments, task, size)
            results["negatives"].setdefault(name, []).append(run)
            print(
                f"{name:<9} {run['train_samples']:>5} lines: pre-trained {run['mean']['pre-trained']:.3f}, random "
                f"init {run['mean']['random init']:.3f} ({run['gain']:+.3f}; ahead on every seed: "
                f"{run['pre_trained_ahead_on_every_seed']})",
                flush=True,
            )
    if arguments.rate_steps:
        from components.lib.modeling import PRESETS

        base = {**PRESETS["roberta-base"], "vocab_size": 25_000}
        results["roberta_base_rate"] = fine_tuning_rate(base, arguments.rate_steps)
        rate = results["roberta_base_rate"]
        print(
            f"roberta-base fine-tuning, 32 x 128 tokens: {rate['seconds_per_step']:.2f} s a step, "
            f"{rate['train_flops_per_second'] / 1e9:,.0f} GFLOP/s training, "
            f"{rate['score_flops_per_second'] / 1e9:,.0f} GFLOP/s scoring on {os.cpu_count()} cores"
        )
    Path(arguments.output).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
