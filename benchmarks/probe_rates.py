"""Does the downstream probe learn an easy task of a user's at its defaults? The probe's former defaults (one rate,
2e-5, and 3 epochs: 24 steps here) against its defaults (each model's rate chosen from a grid on a development
split carved from training, at least 100 steps), on two-class tasks as small as a user's first labelled set (240
sentences to fine-tune on), which a bag of words solves: which of two standard-library packages' docstrings a
sentence comes from (``email`` or ``unittest``: the domain of ``make run``'s corpus, text it never read), and which
of two WikiText-2 articles (another domain). Seeds 1, 2, 3, through the downstream step's own function.

    make run   # a model to probe: runs/<run>/train-step/model
    python benchmarks/probe_rates.py --model runs/<run>/train-step/model [--output benchmarks/results/probe_rates.json]
"""

from __future__ import annotations

import json
import os
import random
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
from components.lib.downstream_tasks import docstring_sentences  # noqa: E402
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
        default=f"2e-5:24;{PROBE_FINE_TUNING['learning_rates']}:{PROBE_FINE_TUNING['min_steps']}",
        metadata={
            "help": "The settings compared, ';'-separated: RATES:MIN_STEPS, RATES one rate or a grid (comma-separated)."
        },
    )
    output: str = field(default="benchmarks/results/probe_rates.json", metadata={"help": "JSON results."})


def two_articles(train_samples: int) -> dict[str, list[dict]]:
    """The sentences of WikiText-2's two longest validation articles (8 words or more), labelled by article."""
    articles: list[list[str]] = []
    for line in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines():
        if HEADING.match(line):
            articles.append([])
        elif articles and line.strip() and not line.startswith(" = "):
            articles[-1] += [sentence for sentence in line.split(" . ") if len(sentence.split()) >= 8]
    return labelled_splits(sorted(articles, key=len)[-2:], train_samples)


def two_packages(train_samples: int) -> dict[str, list[dict]]:
    """The docstring sentences of two standard-library packages, labelled by package."""
    return labelled_splits([docstring_sentences((package,)) for package in ("email", "unittest")], train_samples)


def labelled_splits(classes: list[list[str]], train_samples: int) -> dict[str, list[dict]]:
    """Half of the training samples drawn from each class's texts, the rest of each scored."""
    drawn = [random.Random(0).sample(texts, len(texts)) for texts in classes]
    half = train_samples // 2
    return {
        split: [
            {"text": text.strip(), "label": label}
            for label, texts in enumerate(drawn)
            for text in (texts[:half] if split == "train" else texts[half:])
        ]
        for split in ("train", "validation")
    }


TASKS = {"two packages": two_packages, "two articles": two_articles}


def main() -> None:
    (arguments,) = HfArgumentParser(BenchmarkArguments, allow_abbrev=False).parse_args_into_dataclasses()
    results: dict = {"arguments": asdict(arguments), "tasks": {}}
    for task_name, make_task in TASKS.items():
        with tempfile.TemporaryDirectory() as folder:
            for split, rows in make_task(arguments.train_samples).items():
                Path(folder, f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
            for setting in arguments.settings.split(";"):
                rates, min_steps = setting.split(":")
                probe = DownstreamArguments(
                    model=arguments.model,
                    output=str(Path(folder, "out", setting)),
                    tasks=folder,
                    learning_rates=rates,
                    min_steps=int(min_steps),
                    seeds=arguments.seeds,
                )
                (task,) = downstream(probe)["tasks"]
                results["tasks"].setdefault(task_name, {})[setting] = task
                line = ", ".join(
                    f"{model} {figures['score']:.3f} ± {figures['standard_error']:.3f} (seeds' std "
                    f"{figures['seed_std']:.3f}, rate {figures['learning_rate']:g}, signal {figures['signal']})"
                    for model, figures in ((model, task[model]) for model in PROBE_MODELS)
                )
                bag = task["baselines"]["bag of words"]
                print(f"{task_name}, {setting}: {line}; one class {task['one_class']:.3f}, bag of words {bag:.3f}")
    Path(arguments.output).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
