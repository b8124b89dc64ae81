"""Evaluate a masked language model on shards: loss, perplexity, masked-token accuracy, fill-mask examples.

Masking uses a fixed seed, so two runs, or two models, are scored on exactly the same masked positions.
Loss and accuracy count only the masked positions (the reference recipe's accuracy counted every position,
most of which the model only has to copy). Writes ``metrics.json`` and a Markdown report ``report.md``.

    python -m components.evaluate --model /tmp/model --shards /tmp/shards/validation --output /tmp/eval
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.devices import ACCELERATORS, check_accelerator, select_strategy
from components.lib.errors import InvalidParameter
from components.lib.input_pipeline import EVALUATION_MLM_PROBABILITY, Masking, evaluation_dataset, naming_corrupt_shards
from components.lib.job_runner import run_job
from components.lib.masked_lm import (
    EVALUATION_BATCH_SIZE,
    EVALUATION_MAX_BATCHES,
    MaskedLMScorer,
    check_probability,
    max_predictions,
    unigram_perplexity,
)
from components.lib.pytorch_weights import load_model
from components.lib.results import METRICS_FILE, REPORT_FILE, display_token, metrics_table, standard_error
from components.lib.shard_set import read_manifest, verify_files

log = logging.getLogger("tpu_mlm.evaluate")

DEFAULT_SENTENCES = (
    "The history of the <mask> begins in the early twentieth century.",
    "The function returns a <mask> of values.",
    "In 1990 the band released their first <mask>.",
)


@dataclass
class EvaluateArguments:
    model: str = field(metadata={"help": "Model folder from components.train (local or gs://)."})
    shards: str = field(metadata={"help": "Shard folder with manifest.json to evaluate on."})
    output: str = field(metadata={"help": "Folder for metrics.json and report.md."})
    train_shards: str = field(
        default="", metadata={"help": "The training shards: their token counts give the unigram baseline."}
    )
    batch_size: int = field(default=EVALUATION_BATCH_SIZE, metadata={"help": "Samples per evaluation batch."})
    max_batches: int = field(
        default=EVALUATION_MAX_BATCHES,
        metadata={
            "help": "Evaluate at most this many batches (the first ones, the same in every run, read 16 files at a "
            "time from across the shard set); 0: all. The default scores 9,600 samples: minutes for roberta-base on "
            "8 vCPUs. The loss's standard error is reported, over these samples as if drawn independently from the "
            "set: neighbouring samples of one document are not, and a file's first samples stand for it, so the "
            "loss of the whole set is less certain than it says."
        },
    )
    eval_mlm_probability: float = field(
        default=EVALUATION_MLM_PROBABILITY,
        metadata={"help": "Share of tokens masked; keep the default to compare runs (whatever their training masked)."},
    )
    seed: int = field(default=0, metadata={"help": "Masking seed; keep it fixed to compare runs and models."})
    fill_mask: str = field(
        default=" | ".join(DEFAULT_SENTENCES),
        metadata={"help": "Sentences for fill-mask examples, separated by ' | ', each with <mask>."},
    )
    top_k: int = field(default=5, metadata={"help": "Predictions shown per fill-mask sentence."})
    accelerator: str = field(
        default="auto", metadata={"help": "auto, tpu, gpu or cpu, as for training.", "choices": ACCELERATORS}
    )
    replicas: int = field(default=0, metadata={"help": "Replicas, as for training (0: all devices; CPU: 1)."})

    def __post_init__(self) -> None:
        for parameter in ("model", "shards", "output"):
            storage.check_uri(parameter, getattr(self, parameter))
        if self.train_shards:
            storage.check_uri("train_shards", self.train_shards)
        if self.batch_size < 1:
            raise InvalidParameter("batch_size", self.batch_size, "must be a positive whole number")
        if self.max_batches < 0:
            raise InvalidParameter("max_batches", self.max_batches, "must be positive, or 0 for all")
        check_probability(self.eval_mlm_probability, "eval_mlm_probability")
        if self.top_k < 1:
            raise InvalidParameter("top_k", self.top_k, "must be a positive whole number")
        check_accelerator(self.accelerator, self.replicas)

    @property
    def sentences(self) -> list[str]:
        return [sentence.strip() for sentence in self.fill_mask.split("|") if sentence.strip()]


def fill_mask_examples(model: Any, tokenizer: Any, sentences: list[str], top_k: int) -> list[dict[str, Any]]:
    """Top-k predictions for each sentence through ``pipeline("fill-mask", framework="tf")``."""
    from transformers import pipeline

    # dtype=None: transformers 4.57's default dtype="auto" looks itself up on torch, which is not installed.
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, framework="tf", dtype=None)
    examples = []
    for sentence in sentences:
        text = sentence.replace("<mask>", tokenizer.mask_token)
        predictions = fill(text, top_k=top_k)
        examples.append(
            {
                "sentence": sentence,
                "predictions": [
                    {"token": p["token_str"], "score": round(float(p["score"]), 5), "sequence": p["sequence"]}
                    for p in predictions
                ],
            }
        )
    return examples


def training_token_counts(train_shards: str, manifest: dict[str, Any]) -> list[int] | None:
    """The token counts of the training shards, checked to be of the evaluation shards' tokenizer; None for
    shards written before the counts were kept."""
    training = read_manifest(train_shards, "train_shards")
    if training["tokenizer_fingerprint"] != manifest["tokenizer_fingerprint"]:
        raise InvalidParameter("train_shards", train_shards, "were made with another tokenizer than --shards")
    if "token_counts" not in training:
        log.warning("%s keeps no token counts (written by an older version): no unigram baseline", train_shards)
    return training.get("token_counts")


def evaluate(arguments: EvaluateArguments) -> dict[str, Any]:
    """Scores the model on the shards and writes metrics.json and report.md; returns the metrics."""
    manifest = read_manifest(arguments.shards)
    verify_files(arguments.shards, manifest)
    token_counts = training_token_counts(arguments.train_shards, manifest) if arguments.train_shards else None
    sentences = arguments.sentences
    for sentence in sentences:
        if sentence.count("<mask>") != 1:
            raise InvalidParameter("fill_mask", sentence, "each sentence needs exactly one <mask>")
    started = time.perf_counter()
    strategy, _ = select_strategy(arguments.accelerator, replicas=arguments.replicas)
    with tempfile.TemporaryDirectory() as local:
        model, tokenizer, model_fingerprint = load_model(arguments.model, Path(local), strategy=strategy)
        if model_fingerprint != manifest["tokenizer_fingerprint"]:
            raise InvalidParameter(
                "shards",
                arguments.shards,
                f"were made with another tokenizer ({manifest['tokenizer_fingerprint']}) than the model's "
                f"({model_fingerprint})",
            )
        masking = Masking.from_manifest(manifest, arguments.eval_mlm_probability)
        stream = functools.partial(
            evaluation_dataset,
            arguments.shards,
            manifest,
            arguments.batch_size,
            masking,
            seed=arguments.seed,
        )
        score = MaskedLMScorer(model, strategy, max_predictions(manifest["max_length"], arguments.eval_mlm_probability))
        max_batches = arguments.max_batches or None
        with naming_corrupt_shards(("shards", arguments.shards, manifest)):
            metrics = score(stream, max_batches)
            metrics["unigram_perplexity"] = (
                unigram_perplexity(stream(max_batches=max_batches), token_counts) if token_counts else None
            )
        examples = fill_mask_examples(model, tokenizer, sentences, arguments.top_k) if sentences else []
    metrics.update(
        seconds=round(time.perf_counter() - started, 3),
        split=manifest["split"],
        set_samples=manifest["num_records"],
        mlm_probability=arguments.eval_mlm_probability,
        seed=arguments.seed,
        fill_mask=examples,
        arguments=asdict(arguments),
    )
    storage.write_text_atomic(storage.join(arguments.output, REPORT_FILE), report_markdown(metrics))
    storage.write_text_atomic(storage.join(arguments.output, METRICS_FILE), json.dumps(metrics, indent=2) + "\n")
    log.info(
        "%s: loss %.4f, perplexity %.2f, masked accuracy %.4f on %d masked tokens",
        manifest["split"],
        metrics["loss"],
        metrics["perplexity"],
        metrics["masked_accuracy"],
        metrics["masked_tokens"],
    )
    return metrics


def report_markdown(metrics: dict[str, Any]) -> str:
    lines = [
        f"# Evaluation on `{metrics['split']}`",
        "",
        *metrics_table(metrics),
        "",
        f"Masking: {metrics['mlm_probability']:.0%} of tokens, seed {metrics['seed']} (the same positions "
        "in every run).",
    ]
    for example in metrics["fill_mask"]:
        lines += ["", f"**{example['sentence']}**", "", "| token | score |", "|---|---|"]
        lines += [f"| `{display_token(p['token'])}` | {p['score']:.4f} |" for p in example["predictions"]]
    return "\n".join(lines) + "\n"


def summary_for_people(metrics: dict[str, Any]) -> str:
    unigram = metrics.get("unigram_perplexity")
    baseline = f" (unigram baseline {unigram:,.2f})" if unigram else ""
    return (
        f"{metrics['split']}: loss {metrics['loss']:.4f}{standard_error(metrics)}, "
        f"perplexity {metrics['perplexity']:,.2f}{baseline}, "
        f"masked accuracy {metrics['masked_accuracy']:.2%} on {metrics['masked_tokens']:,} masked tokens of "
        f"{metrics['samples']:,} samples "
        f"({metrics['mlm_probability']:.0%} masked, seed {metrics['seed']})\n"
        f"metrics.json and report.md (fill-mask examples): {metrics['arguments']['output']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(EvaluateArguments, evaluate, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
