"""Does the downstream probe learn an easy task of a user's at its defaults? The probe's former defaults (one rate,
2e-5, for both models) against its grid (each model's rate chosen on a development split carved from training),
on a two-class task as small as a user's first labelled set: which of two WikiText-2 articles a sentence comes
from (240 sentences to fine-tune on), a task a bag of words solves. Both at the pipeline's budget (3 epochs of 32
samples) and seeds 1, 2, 3, through the downstream step's own function.

    make run   # a model to probe: runs/<run>/train-step/model
    python benchmarks/probe_rates.py --model runs/<run>/train-step/model [--output benchmarks/results/probe_rates.json]
"""

from __future__ import annotations

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

from components.downstream import DownstreamArguments, downstream  # noqa: E402
from components.lib.estimates import PROBE_FINE_TUNING  # noqa: E402
from components.lib.results import PROBE_MODELS  # noqa: E402

WIKITEXT_VALID = PROJECT.parent / "shared" / "data" / "wikitext-2" / "valid.txt"
HEADING = re.compile(r"^ = [^=].* = $")


@dataclass
class BenchmarkArguments:
    model: str = field(metadata={"help": "A pre-trained model folder (make run's: runs/<run>/train-step/model)."})
    train_samples: int = field(default=240, metadata={"help": "Sentences to fine-tune on, half an article each."})
    seeds: str = field(default="1,2,3", metadata={"help": "Seeds of each setting."})
    settings: str = field(
        default=f"2e-5;{PROBE_FINE_TUNING['learning_rates']}",
        metadata={"help": "The learning rates compared, ';'-separated: one rate, or a grid (comma-separated)."},
    )
    output: str = field(default="benchmarks/results/probe_rates.json", metadata={"help": "JSON results."})


def two_articles(train_samples: int) -> dict[str, list[dict]]:
    """The sentences of WikiText-2's two longest validation articles (8 words or more), labelled by article: half of
    the training samples from each, the rest of each article scored."""
    articles: list[list[str]] = []
    for line in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines():
        if HEADING.match(line):
            articles.append([])
        elif articles and line.strip() and not line.startswith(" = "):
            articles[-1] += [sentence for sentence in line.split(" . ") if len(sentence.split()) >= 8]
    longest = sorted(articles, key=len, reverse=True)[:2]
    half = train_samples // 2
    return {
        split: [
            {"text": sentence.strip(), "label": label}
            for label, article in enumerate(longest)
            for sentence in (article[:half] if split == "train" else article[half:])
        ]
        for split in ("train", "validation")
    }


def main() -> None:
    (arguments,) = HfArgumentParser(BenchmarkArguments, allow_abbrev=False).parse_args_into_dataclasses()
    results: dict = {"arguments": asdict(arguments), "settings": {}}
    with tempfile.TemporaryDirectory() as folder:
        for split, rows in two_articles(arguments.train_samples).items():
            Path(folder, f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        for rates in arguments.settings.split(";"):
            probe = DownstreamArguments(
                model=arguments.model,
                output=str(Path(folder, "out", rates)),
                tasks=folder,
                learning_rates=rates,
                seeds=arguments.seeds,
            )
            (task,) = downstream(probe)["tasks"]
            results["settings"][rates] = task
            line = ", ".join(
                f"{model} {figures['score']:.3f} ± {figures['standard_error']:.3f} (seeds' std "
                f"{figures['seed_std']:.3f}, rate {figures['learning_rate']:g}, signal {figures['signal']})"
                for model, figures in ((model, task[model]) for model in PROBE_MODELS)
            )
            print(f"rates {rates}: {line}; majority class {task['majority_class']:.3f}", flush=True)
    Path(arguments.output).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
