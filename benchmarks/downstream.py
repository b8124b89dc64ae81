"""The downstream probe's built-in task, what the model it probes knows of word order, and what fine-tuning costs.

1. Which word-order task tells `make run`'s model from its randomly initialised twin, when its words, its edges
   and its length cannot: windows of a few words of text the model never read (``word_order_task``), as they are
   or made negatives (reversed, each pair of neighbouring words swapped, the two halves swapped, shuffled, one
   word replaced by one drawn from the text), at several window lengths and numbers of labelled windows; each
   candidate probed as ``make run`` probes (run-local's probe settings: each model's rate chosen on a development
   split, three seeds), with the trivial baselines. The candidate is chosen on the development split (the largest
   gain of the pre-trained model's best development score over the twin's), never on the validation split that is
   reported.
2. Whether the model knows word order at all, without fine-tuning: its own masked-LM pseudo-log-likelihood (each
   token masked in turn) of validation windows as written and reversed, against its twin's. A model that scores
   both alike has no order to give a probe.
3. The model FLOP/s of a fine-tuning step of ``roberta-base`` (random weights, 32 samples of 128 tokens) on this
   machine: the rate the estimate prices the probe at.

    make run   # a model to probe: runs/<run>/train-step/model
    python benchmarks/downstream.py --model runs/<run>/train-step/model [--output benchmarks/results/downstream.json]
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from transformers import HfArgumentParser  # noqa: E402

from components.downstream import DownstreamArguments, encode_for_probe, probe_task  # noqa: E402
from components.lib import storage  # noqa: E402
from components.lib.downstream_tasks import Corruption, _head, reversed_words, word_order_task  # noqa: E402
from components.lib.pytorch_weights import TF_LOADING  # noqa: E402
from components.lib.results import PROBE_MODELS  # noqa: E402
from pipelines.routes import ROUTES  # noqa: E402
from pipelines.run_local import LOCAL_DEFAULTS  # noqa: E402


@dataclass
class BenchmarkArguments:
    model: str = field(metadata={"help": "A pre-trained model folder (make run's: runs/<run>/train-step/model)."})
    windows: str = field(default="10", metadata={"help": "Window lengths in words, comma-separated."})
    negatives: str = field(
        default="reversed,shuffled,replaced", metadata={"help": "Negatives, comma-separated (of NEGATIVES)."}
    )
    train_samples: str = field(
        default="256",
        metadata={"help": "Training windows to fine-tune on (before the development split), comma-separated."},
    )
    # a grid and its development split to choose a candidate by (make run's own probe has one rate); the settings
    # of benchmarks/results/downstream.json
    max_steps: int = field(default=150, metadata={"help": "Fine-tuning steps (0: run-local's)."})
    learning_rates: str = field(
        default="3e-4,1e-3,3e-3", metadata={"help": "The probe's rate grid, at least two (empty: run-local's)."}
    )
    order_windows: int = field(
        default=300, metadata={"help": "Validation windows whose pseudo-log-likelihood is compared; 0: skip."}
    )
    rate_steps: int = field(default=3, metadata={"help": "roberta-base steps timed for the rate; 0: skip."})
    output: str = field(default="benchmarks/results/downstream.json", metadata={"help": "JSON results."})


def swapped_pairs(words: list[str], split_words: list[str], draw: random.Random) -> list[str] | None:
    """Each pair of neighbouring words swapped: every word kept, each next to one of its neighbours."""
    swapped = [word for at in range(0, len(words) - 1, 2) for word in (words[at + 1], words[at])]
    swapped += words[len(swapped) :]
    return None if swapped == words else swapped


def swapped_halves(words: list[str], split_words: list[str], draw: random.Random) -> list[str] | None:
    """The second half first: one seam out of order, the rest as written."""
    half = len(words) // 2
    return words[half:] + words[:half]


def shuffled(words: list[str], split_words: list[str], draw: random.Random) -> list[str] | None:
    """The same words in a random order."""
    mixed = draw.sample(words, len(words))
    return None if mixed == words else mixed


def replaced_word(words: list[str], split_words: list[str], draw: random.Random) -> list[str] | None:
    """One word, anywhere in the window, replaced by a word drawn from the split's running text: as frequent in the
    negatives as in the text, so the words alone do not tell the two apart; only their fit in the context does."""
    at, word = draw.randrange(len(words)), draw.choice(split_words)
    return None if word == words[at] else [*words[:at], word, *words[at + 1 :]]


NEGATIVES: dict[str, Corruption] = {
    "reversed": reversed_words,
    "pairs": swapped_pairs,
    "halves": swapped_halves,
    "shuffled": shuffled,
    "replaced": replaced_word,
}


def probe_settings(model: str) -> DownstreamArguments:
    """``make run``'s probe: run-local's settings of the pipeline parameters that reach the downstream step."""
    local = {ROUTES[key]["downstream"]: value for key, value in LOCAL_DEFAULTS.items() if "downstream" in ROUTES[key]}
    return DownstreamArguments(model=model, output="unused", **local)


def best_dev(result: dict, model: str) -> float:
    return max(point["dev_score"] or 0.0 for point in result[model]["learning_rate_search"])


def candidate(model_dir: Path, settings: DownstreamArguments, window: int, negative: str, samples: int) -> dict:
    """One word-order task probed as make run probes it, on ``samples`` training windows: both models' figures, the
    baselines, the dev scores."""
    task = word_order_task(window, NEGATIVES[negative])
    task = replace(task, train=_head(task.train, samples))
    (result,) = probe_task(model_dir, encode_for_probe(model_dir, task, settings), settings)
    result["dev_gain"] = best_dev(result, PROBE_MODELS[0]) - best_dev(result, PROBE_MODELS[1])
    return {"window": window, "negative": negative, "samples": samples, **result}


def pseudo_log_likelihood(model, ids: list[int], mask_id: int) -> float:
    """The mean log-probability the masked LM gives each token of a sample with that token masked (the sample's
    special tokens excluded)."""
    import numpy as np
    import tensorflow as tf

    positions = range(1, len(ids) - 1)
    batch = np.array([ids] * len(positions))
    for row, position in enumerate(positions):
        batch[row, position] = mask_id
    log_probabilities = tf.nn.log_softmax(model(batch).logits).numpy()
    return float(np.mean([log_probabilities[row, at, ids[at]] for row, at in enumerate(positions)]))


def order_preference(model_dir: Path, windows: int) -> dict:
    """For the pre-trained model and its twin (the same config, random weights): on the built-in task's first
    ``windows`` validation windows, each as written and reversed, the share whose written order the model's
    pseudo-log-likelihood prefers and the mean difference (nats a token)."""
    import numpy as np
    import tensorflow as tf
    from transformers import AutoConfig, AutoTokenizer, TFAutoModelForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    validation = word_order_task().validation
    written = [text for (text,), label in zip(validation.texts, validation.labels, strict=True) if label == 1]
    tf.keras.utils.set_random_seed(0)
    models = {
        PROBE_MODELS[0]: TFAutoModelForMaskedLM.from_pretrained(model_dir, **TF_LOADING),
        PROBE_MODELS[1]: TFAutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(model_dir)),
    }
    preference = {}
    for name, model in models.items():
        scores = np.array(
            [
                [
                    pseudo_log_likelihood(
                        model, tokenizer(words, truncation=True)["input_ids"], tokenizer.mask_token_id
                    )
                    for words in (text, " ".join(text.split()[::-1]))
                ]
                for text in written[:windows]
            ]
        )
        differences = scores[:, 0] - scores[:, 1]
        preference[name] = {
            "windows": len(differences),
            "written_order_preferred": float(np.mean(differences > 0)),
            "mean_difference": float(differences.mean()),
            "difference_standard_error": float(differences.std(ddof=1) / np.sqrt(len(differences))),
            "mean_pseudo_log_likelihood": float(scores[:, 0].mean()),
        }
    return preference


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
    settings = probe_settings(arguments.model)
    if arguments.max_steps:
        settings = replace(settings, max_steps=arguments.max_steps)
    if arguments.learning_rates:
        settings = replace(settings, learning_rates=arguments.learning_rates)
    results: dict = {"arguments": asdict(arguments), "probe": asdict(settings), "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as local:
        storage.download_folder(arguments.model, Path(local))
        results["candidates"] = [
            candidate(Path(local), settings, int(window), negative, int(samples))
            for samples in filter(None, arguments.train_samples.split(","))
            for window in arguments.windows.split(",")
            for negative in arguments.negatives.split(",")
        ]
        if arguments.order_windows:
            results["order_preference"] = order_preference(Path(local), arguments.order_windows)
    for run in results["candidates"]:
        baselines = ", ".join(f"{name} {score:.3f}" for name, score in run["baselines"].items())
        print(
            f"{run['samples']:>4} x {run['window']:>2} words {run['negative']:<8}: dev gain {run['dev_gain']:+.3f}; "
            "validation: "
            f"pre-trained {run['pre-trained']['score']:.3f} (seeds' sd {run['pre-trained']['seed_std']:.3f}), "
            f"random init {run['random init']['score']:.3f} (sd {run['random init']['seed_std']:.3f}); {baselines}",
            flush=True,
        )
    if arguments.order_windows:
        for name, found in results["order_preference"].items():
            print(
                f"{name}: written order preferred on {found['written_order_preferred']:.3f} of {found['windows']} "
                f"windows, by {found['mean_difference']:+.4f} ± {found['difference_standard_error']:.4f} nats a "
                f"token (pseudo-log-likelihood {found['mean_pseudo_log_likelihood']:.3f})"
            )
    if results["candidates"]:
        chosen = max(results["candidates"], key=lambda run: run["dev_gain"])
        results["chosen"] = {key: chosen[key] for key in ("samples", "window", "negative")}
        print(f"chosen on the development split: {results['chosen']}")
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
