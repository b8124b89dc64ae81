"""Does the built-in probe measure pre-training? ``make run``'s whole pipeline (run-local at its defaults) at several
training lengths, everything else alike: at each, the validation perplexity against the unigram baseline's, and the
built-in word-order task's scores (the pre-trained model and its random twin, every seed's, their spread and
sampling error, the trivial baselines, the verdict), with each step's time. If the task measures what pre-training
learns, the pre-trained model's score rises above its twin's and the baselines' as training lengthens; a model that
has learnt no order shows no signal on it, whatever the probe's settings.

    python benchmarks/probe_training.py [--steps 700,1500,5000] [--output benchmarks/results/probe_training.json]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from transformers import HfArgumentParser  # noqa: E402

from components.lib.downstream_tasks import WORD_ORDER  # noqa: E402
from components.lib.results import PROBE_MODELS  # noqa: E402
from pipelines.run_local import LOCAL_DEFAULTS, RunLocalArguments, run_local  # noqa: E402

# a finished step's line on run-local's stderr: its label, status and seconds
STEP_LINE = re.compile(r"^(.+?)\s+(SUCCESS|FAILURE)\s+([0-9.]+) s")


@dataclass
class BenchmarkArguments:
    steps: str = field(
        default=f"{LOCAL_DEFAULTS['max_steps']},1500,5000",
        metadata={"help": "Training steps of each run, comma-separated (make run's first)."},
    )
    output: str = field(default="benchmarks/results/probe_training.json", metadata={"help": "JSON results."})


class Tee(io.TextIOBase):
    """Writes to the console and keeps a copy: the steps' lines show as they finish, and are parsed after."""

    def __init__(self, out: io.TextIOBase) -> None:
        self.out, self.kept = out, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def probe_summary(task: dict) -> dict:
    """What the word-order task's entry of downstream.json says, without the runs' details."""
    models = {
        model: {key: task[model][key] for key in ("score", "seed_scores", "seed_std", "standard_error", "signal")}
        for model in PROBE_MODELS
    }
    return {
        **models,
        "gain": task["gain"],
        "majority_class": task["majority_class"],
        "baselines": task["baselines"],
        "train_samples": task["train_samples"],
        "validation_samples": task["validation_samples"],
    }


def run_at(steps: int, root: str) -> dict:
    """make run's pipeline with ``steps`` training steps: its perplexities, its probe's word-order task, step times."""
    stderr = Tee(sys.stderr)
    with contextlib.redirect_stderr(stderr):
        summary = run_local(RunLocalArguments(max_steps=steps, pipeline_root=root))
    step_seconds = {
        found.group(1): float(found.group(3))
        for found in map(STEP_LINE.match, stderr.kept.getvalue().splitlines())
        if found
    }
    (task,) = (task for task in summary["downstream"]["tasks"] if task["task"] == WORD_ORDER)
    metrics = summary["metrics"]
    return {
        "max_steps": steps,
        "pipeline_seconds": summary["seconds"],
        "step_seconds": step_seconds,
        "perplexity": metrics["perplexity"],
        "unigram_perplexity": metrics["unigram_perplexity"],
        "perplexity_to_unigram": metrics["perplexity"] / metrics["unigram_perplexity"],
        "masked_accuracy": metrics["masked_accuracy"],
        "word_order": probe_summary(task),
    }


def main() -> None:
    (arguments,) = HfArgumentParser(BenchmarkArguments).parse_args_into_dataclasses()
    results = []
    with tempfile.TemporaryDirectory() as root:
        for steps in (int(value) for value in arguments.steps.split(",")):
            results.append(run_at(steps, root))
            print(json.dumps(results[-1], indent=2), flush=True)
    output = {
        "arguments": asdict(arguments),
        "run_local": {**LOCAL_DEFAULTS, "max_steps": "as above"},
        "cores": os.cpu_count(),
        "runs": results,
    }
    Path(arguments.output).write_text(json.dumps(output, indent=2) + "\n")
    for run in results:
        probe = run["word_order"]
        pre_trained, twin = (probe[model] for model in PROBE_MODELS)
        print(
            f"{run['max_steps']:>6} steps: perplexity {run['perplexity_to_unigram']:.2f} of the unigram's, word-order "
            f"{pre_trained['score']:.3f} (seeds sd {pre_trained['seed_std']:.3f}) against the twin's "
            f"{twin['score']:.3f}, gain {probe['gain']:+.3f}; pipeline {run['pipeline_seconds']:.0f} s"
        )


if __name__ == "__main__":
    main()
