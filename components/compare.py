"""Which of two models is better at the masked-LM task, and by more than chance? Both score the same samples with the
same masks (the evaluation's: fixed 15% masks from the seed and each sample's place), and the difference of their
losses comes with the error of a paired comparison: each sample's difference, which leaves out how hard the sample
is for both, is what varies. Two models evaluated apart each carry that spread; their difference here does not.

Both models must share a tokenizer (the shards are that tokenizer's ids): two recipes, two learning rates or two
steps of one run's checkpoints, trained on the same shards.

    python -m components.compare --model runs/A/train-step/model --baseline runs/B/train-step/model \\
        --shards runs/A/merge-shards-step-2/shards --output /tmp/compare
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.input_pipeline import EVALUATION_MLM_PROBABILITY, Masking, evaluation_dataset, naming_corrupt_shards
from components.lib.job_runner import run_job
from components.lib.masked_lm import (
    EVALUATION_BATCH_SIZE,
    EVALUATION_MAX_BATCHES,
    max_predictions,
    ratio_standard_error,
    sample_losses,
)
from components.lib.pytorch_weights import load_model
from components.lib.shard_set import read_manifest, verify_files

log = logging.getLogger("tpu_mlm.compare")
COMPARISON_FILE = "comparison.json"


@dataclass
class CompareArguments:
    model: str = field(metadata={"help": "The model folder to compare (local or gs://)."})
    baseline: str = field(metadata={"help": "The model folder it is compared with, of the same tokenizer."})
    shards: str = field(metadata={"help": "Validation shards of that tokenizer (local or gs://)."})
    output: str = field(metadata={"help": f"Folder for {COMPARISON_FILE}."})
    batch_size: int = field(default=EVALUATION_BATCH_SIZE, metadata={"help": "Samples per batch."})
    max_batches: int = field(
        default=EVALUATION_MAX_BATCHES,
        metadata={"help": "Score at most this many batches, as the evaluate step does; 0: all."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the masks (the evaluation's: the same samples, masks)."})

    def __post_init__(self) -> None:
        for parameter in ("model", "baseline", "shards", "output"):
            storage.check_uri(parameter, getattr(self, parameter))
        if self.batch_size < 1:
            raise InvalidParameter("batch_size", self.batch_size, "must be a positive whole number")
        if self.max_batches < 0:
            raise InvalidParameter("max_batches", self.max_batches, "must be 0 (all) or a positive whole number")


def losses_of_samples(model: Any, batches: Any, predictions: int) -> tuple[list[float], list[float]]:
    """Each sample's summed masked-token loss and its masked tokens, in the batches' order."""
    import tensorflow as tf

    per_sample = tf.function(lambda batch: sample_losses(model, batch, predictions)[:2])
    losses, tokens = [], []
    for batch in batches:
        loss, count = per_sample(batch)
        losses += loss.numpy().tolist()
        tokens += count.numpy().tolist()
    return losses, tokens


def ratio_and_error(values: Sequence[float], tokens: Sequence[float]) -> tuple[float, float]:
    """sum(values) / sum(tokens) over the samples, and its standard error (``ratio_standard_error``)."""
    pairs = list(zip(values, tokens, strict=True))
    sums = (
        sum(value for value, _ in pairs),
        sum(count for _, count in pairs),
        sum(value**2 for value, _ in pairs),
        sum(value * count for value, count in pairs),
        sum(count**2 for _, count in pairs),
    )
    return sums[0] / sums[1], ratio_standard_error(*sums, len(pairs))


def compare(arguments: CompareArguments) -> dict[str, Any]:
    """Scores both models on the same masked samples; writes and returns the paired comparison."""
    import tensorflow as tf

    manifest = read_manifest(arguments.shards)
    verify_files(arguments.shards, manifest)
    masking = Masking.from_manifest(manifest, EVALUATION_MLM_PROBABILITY)
    stream = functools.partial(
        evaluation_dataset, arguments.shards, manifest, arguments.batch_size, masking, seed=arguments.seed
    )
    predictions = max_predictions(manifest["max_length"], EVALUATION_MLM_PROBABILITY)
    scored: dict[str, tuple[list[float], list[float]]] = {}
    for parameter in ("model", "baseline"):
        with tempfile.TemporaryDirectory() as local:
            model, _, tokenizer_fingerprint = load_model(getattr(arguments, parameter), Path(local), parameter)
            if tokenizer_fingerprint != manifest["tokenizer_fingerprint"]:
                raise InvalidParameter(
                    parameter,
                    getattr(arguments, parameter),
                    f"has another tokenizer ({tokenizer_fingerprint}) than the shards' "
                    f"({manifest['tokenizer_fingerprint']}): models are compared on the same tokens",
                )
            with naming_corrupt_shards(("shards", arguments.shards, manifest)):
                scored[parameter] = losses_of_samples(
                    model, stream(max_batches=arguments.max_batches or None), predictions
                )
            del model
            tf.keras.backend.clear_session()
    (model_losses, tokens), (baseline_losses, baseline_tokens) = scored["model"], scored["baseline"]
    if tokens != baseline_tokens or not sum(tokens):
        raise InvalidParameter("shards", arguments.shards, "gave the two models other samples or no masked token")
    model_loss, model_error = ratio_and_error(model_losses, tokens)
    baseline_loss, baseline_error = ratio_and_error(baseline_losses, tokens)
    difference, paired_error = ratio_and_error(
        [a - b for a, b in zip(model_losses, baseline_losses, strict=True)], tokens
    )
    result = {
        "model_loss": model_loss,
        "model_standard_error": model_error,
        "baseline_loss": baseline_loss,
        "baseline_standard_error": baseline_error,
        # model minus baseline, its paired error, and how many errors apart: below -2, the model is the better
        "difference": difference,
        "paired_standard_error": paired_error,
        "z": difference / paired_error if paired_error else math.nan,
        "samples": len(tokens),
        "masked_tokens": int(sum(tokens)),
        "arguments": asdict(arguments),
    }
    storage.write_text_atomic(storage.join(arguments.output, COMPARISON_FILE), json.dumps(result, indent=2) + "\n")
    return result


def summary_for_people(result: dict[str, Any]) -> str:
    verdict = (
        "no difference beyond chance"
        if not abs(result["z"]) > 2
        else "the model is better"
        if result["difference"] < 0
        else "the baseline is better"
    )
    return (
        f"loss {result['model_loss']:.4f} ± {result['model_standard_error']:.4f} (model) against "
        f"{result['baseline_loss']:.4f} ± {result['baseline_standard_error']:.4f} (baseline) on the same "
        f"{result['masked_tokens']:,} masked tokens of {result['samples']:,} samples: difference "
        f"{result['difference']:+.4f} ± {result['paired_standard_error']:.4f} paired ({result['z']:+.1f} errors): "
        f"{verdict}\n{COMPARISON_FILE}: {result['arguments']['output']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(CompareArguments, compare, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
