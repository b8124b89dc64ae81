"""Training recipes side by side: the steps each needs to reach the reference recipe's validation loss, and its
held-out loss at the same step budget.

Every run trains the same small RoBERTa on the same WikiText-2 shards, at the same global batch and step budget,
with the train step's own command (``python -m components.train``), and is scored by the evaluate step's command
at its fixed 15% masks. Each candidate runs with the same seeds as the reference, so a seed's runs start from the
same weights and read the same batches.

The data (``../shared/data/wikitext-2``, which holds no training split): the tokenizer and the training shards are
made from ``test.txt``; ``valid.txt`` is cut in two at an article boundary: its first half is the validation
during training (the points the steps-to-loss are read from, and the only text a recipe is chosen on), its second
half is held out for the final score.

    python benchmarks/recipes.py [--quick] [--steps 1000] [--seeds 1,2,3]
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"
REFERENCE = "hf-2023"
# name: the train step's settings beside the shared ones (a recipe, and the knobs given over it)
CANDIDATES: dict[str, dict[str, Any]] = {
    REFERENCE: {"recipe": "hf-2023"},
    "hf-2023 at 5e-4": {"recipe": "hf-2023", "learning_rate": 5e-4},  # apart: what roberta-2019 adds besides its peak
    "roberta-2019": {"recipe": "roberta-2019"},
    "roberta-2019 + masking 30%->15%": {
        "recipe": "roberta-2019",
        "mlm_probability": 0.3,
        "final_mlm_probability": 0.15,
    },
    "roberta-2019 + masking 30%->15% + wsd": {
        "recipe": "roberta-2019",
        "mlm_probability": 0.3,
        "final_mlm_probability": 0.15,
        "lr_schedule": "wsd",
        "decay_fraction": 0.2,
    },
}


@dataclass
class RecipeBenchmarkArguments:
    candidates: str = field(
        default=",".join(list(CANDIDATES)[:4]),
        metadata={"help": f"Recipes compared, comma-separated, of {list(CANDIDATES)}."},
    )
    seeds: str = field(default="1,2,3", metadata={"help": "Seeds, comma-separated; each recipe runs with each."})
    quick: bool = field(default=False, metadata={"help": "One seed (the first)."})
    steps: int = field(default=1000, metadata={"help": "Optimizer steps of every run (the budget)."})
    batch_size: int = field(default=32, metadata={"help": "Global batch of every run."})
    model_config: str = field(default="mini", metadata={"help": "Model preset of every run."})
    vocab_size: int = field(default=8000, metadata={"help": "Tokenizer pieces."})
    validations: int = field(default=20, metadata={"help": "Validation points per run."})
    eval_batches: int = field(default=16, metadata={"help": "Validation batches at each point."})
    work_dir: str = field(default="", metadata={"help": "Folder for shards and runs (kept); default: a temporary one."})
    output: str = field(default="benchmarks/results/recipes.json", metadata={"help": "JSON results."})
    plot: str = field(default="docs/images/recipes.png", metadata={"help": "Validation curves; '' for none."})

    def __post_init__(self) -> None:
        unknown = [name for name in self.names if name not in CANDIDATES]
        if unknown:
            raise SystemExit(f"--candidates: unknown {unknown}; known: {list(CANDIDATES)}")
        if self.names[0] != REFERENCE:
            raise SystemExit(f"--candidates must start with the reference, {REFERENCE}")
        if self.steps % self.validations:
            raise SystemExit(f"--steps {self.steps} must be a multiple of --validations {self.validations}")

    @property
    def names(self) -> list[str]:
        return self.candidates.split(",")

    @property
    def seed_list(self) -> list[int]:
        seeds = [int(seed) for seed in self.seeds.split(",")]
        return seeds[:1] if self.quick else seeds


def split_at_article(text: str) -> tuple[str, str]:
    """The text cut at the start of the article nearest its middle (WikiText's ' = Title = ' lines)."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(" = ") and not line.startswith(" = = ")]
    middle = min(starts, key=lambda i: abs(i - len(lines) // 2))
    return "".join(lines[:middle]), "".join(lines[middle:])


def run(module: str, flags: dict[str, Any], log: Path) -> float:
    """Runs a project command (``python -m module --flag value ...``), its output to ``log``; returns its wall
    seconds."""
    command = [sys.executable, "-m", module]
    for key, value in flags.items():
        command += [f"--{key}", str(value)]
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{module} failed ({done.returncode}): see {log}")
    return time.perf_counter() - started


def prepare_data(work: Path, arguments: RecipeBenchmarkArguments) -> dict[str, str]:
    """Tokenizer and shards, made once (kept in ``work`` between runs of the benchmark)."""
    paths = {name: str(work / name) for name in ("tokenizer", "train", "validation", "held_out")}
    if (work / "held_out" / "manifest.json").exists():
        return paths
    selection, held_out = split_at_article((WIKITEXT / "valid.txt").read_text())
    (work / "validation.txt").write_text(selection)
    (work / "held_out.txt").write_text(held_out)
    corpus = WIKITEXT / "test.txt"
    flags = {"corpus": corpus, "vocab_size": arguments.vocab_size, "output": paths["tokenizer"]}
    run("components.tokenizer", flags, work / "tokenizer.log")
    for name in ("train", "validation", "held_out"):
        source = corpus if name == "train" else work / f"{name}.txt"
        flags = {"tokenizer": paths["tokenizer"], "corpus": source, "output": paths[name]}
        run("components.shards", flags, work / f"{name}.log")
    return paths


def validation_curve(summary: dict[str, Any]) -> list[tuple[int, float]]:
    return [(int(point["step"]), point["eval_loss"]) for point in summary["history"] if "eval_loss" in point]


def steps_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """The first step at which the validation loss reaches ``target``, interpolated linearly between validation
    points; None if it never does."""
    previous = None
    for step, loss in curve:
        if loss <= target:
            if previous is None:
                return float(step)
            (step0, loss0) = previous
            return step0 + (step - step0) * (loss0 - target) / (loss0 - loss)
        previous = (step, loss)
    return None


def train_and_score(name: str, seed: int, data: dict[str, str], arguments: RecipeBenchmarkArguments, work: Path):
    folder = work / "runs" / f"{re.sub('[^a-z0-9]+', '-', name.lower())}-{seed}"
    summary_file = folder / "model" / "training_summary.json"
    every = arguments.steps // arguments.validations
    settings = {
        "tokenizer": data["tokenizer"],
        "train_shards": data["train"],
        "eval_shards": data["validation"],
        "model_config": arguments.model_config,
        "per_replica_batch_size": arguments.batch_size,
        "max_steps": arguments.steps,
        "seed": seed,
        "checkpoint_every_steps": every,
        "log_every_steps": every,
        "eval_batches": arguments.eval_batches,
        "output": str(folder / "model"),
        **CANDIDATES[name],
    }
    train_seconds = 0.0
    if not summary_file.exists():  # a benchmark stopped half-way goes on from its last finished run
        folder.mkdir(parents=True, exist_ok=True)
        train_seconds = run("components.train", settings, folder / "train.log")
    summary = json.loads(summary_file.read_text())
    metrics_file = folder / "evaluation" / "metrics.json"
    if not metrics_file.exists():
        flags = {"model": folder / "model", "shards": data["held_out"], "train_shards": data["train"]}
        run("components.evaluate", {**flags, "output": folder / "evaluation"}, folder / "evaluate.log")
    metrics = json.loads(metrics_file.read_text())
    return {
        "recipe": name,
        "seed": seed,
        "settings": {key: value for key, value in summary["arguments"].items() if key in RECIPE_KNOBS},
        "curve": validation_curve(summary),
        "held_out_loss": metrics["loss"],
        "held_out_perplexity": metrics["perplexity"],
        "held_out_masked_accuracy": metrics["masked_accuracy"],
        "unigram_perplexity": metrics.get("unigram_perplexity"),
        "train_seconds": train_seconds or summary.get("seconds_this_run"),
    }


def compare(runs: list[dict[str, Any]], names: list[str], steps: int) -> list[dict[str, Any]]:
    """Each recipe's steps to the reference's final validation loss (of the same seed) as a share of the budget,
    and its held-out loss; means over seeds."""
    reference = {run["seed"]: run["curve"][-1][1] for run in runs if run["recipe"] == REFERENCE}
    rows = []
    for name in names:
        mine = [run for run in runs if run["recipe"] == name]
        reached = [steps_to_reach(run["curve"], reference[run["seed"]]) for run in mine]
        ratios = [None if value is None else value / steps for value in reached]
        for run, ratio in zip(mine, ratios, strict=True):
            run["steps_ratio"] = ratio
        known = [ratio for ratio in ratios if ratio is not None]
        rows.append(
            {
                "recipe": name,
                "seeds": len(mine),
                "steps_ratio_mean": statistics.mean(known) if len(known) == len(mine) else None,
                "steps_ratio_worst": max(known) if len(known) == len(mine) else None,
                "steps_ratios": ratios,
                "final_validation_loss_mean": statistics.mean(run["curve"][-1][1] for run in mine),
                "held_out_loss_mean": statistics.mean(run["held_out_loss"] for run in mine),
                "held_out_loss_spread": max(r["held_out_loss"] for r in mine) - min(r["held_out_loss"] for r in mine),
                "held_out_perplexity_mean": statistics.mean(run["held_out_perplexity"] for run in mine),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def ratio(value: float | None) -> str:
        return "not reached" if value is None else f"{value:.2f}"

    lines = [
        "| recipe | steps to the reference's loss (mean, worst, each seed) | final validation loss | held-out loss | "
        "held-out perplexity |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        each = ", ".join(ratio(value) for value in row["steps_ratios"])
        lines.append(
            f"| `{row['recipe']}` | {ratio(row['steps_ratio_mean'])}, {ratio(row['steps_ratio_worst'])} ({each}) | "
            f"{row['final_validation_loss_mean']:.3f} | {row['held_out_loss_mean']:.3f} "
            f"(spread {row['held_out_loss_spread']:.3f}) | {row['held_out_perplexity_mean']:.1f} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], names: list[str], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.2))
    for color, name in enumerate(names):
        for index, run in enumerate(run for run in runs if run["recipe"] == name):
            steps, losses = zip(*run["curve"], strict=True)
            axes.plot(steps, losses, color=f"C{color}", alpha=0.8, label=name if index == 0 else None)
    axes.set(xlabel="optimizer step", ylabel="validation loss (15% masks)", title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


RECIPE_KNOBS = (
    "recipe", "learning_rate", "adam_beta2", "adam_epsilon", "clip_norm", "warmup_fraction", "warmup_steps",
    "lr_schedule", "decay_fraction", "weight_decay", "mlm_probability", "final_mlm_probability",
)  # fmt: skip


def main() -> None:
    (arguments,) = HfArgumentParser(RecipeBenchmarkArguments).parse_args_into_dataclasses()
    if not (WIKITEXT / "valid.txt").exists():
        raise SystemExit(f"this benchmark reads WikiText-2 from {WIKITEXT}")
    work = Path(arguments.work_dir or tempfile.mkdtemp(prefix="recipes-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = prepare_data(work, arguments)
    runs = []
    for seed in arguments.seed_list:
        for name in arguments.names:
            print(f"[{time.perf_counter() - started:6.0f} s] {name}, seed {seed}", flush=True)
            runs.append(train_and_score(name, seed, data, arguments, work))
            print(f"         held-out loss {runs[-1]['held_out_loss']:.4f}", flush=True)
    rows = compare(runs, arguments.names, arguments.steps)
    manifest = json.loads(Path(data["train"], "manifest.json").read_text())
    setup = (
        f"`{arguments.model_config}`, {manifest['num_records']:,} training samples of {manifest['max_length']} tokens, "
        f"global batch {arguments.batch_size}, {arguments.steps} steps, seeds {arguments.seed_list}"
    )
    result = {
        "command": "python " + " ".join(sys.argv),
        "arguments": asdict(arguments),
        "setup": setup,
        "minutes": (time.perf_counter() - started) / 60,
        "rows": rows,
        "runs": runs,
    }
    Path(arguments.output).parent.mkdir(parents=True, exist_ok=True)
    Path(arguments.output).write_text(json.dumps(result, indent=1) + "\n")
    if arguments.plot:
        plot(runs, arguments.names, arguments.plot, setup.replace("`", ""))
    print(setup)
    print(table(rows))
    print(f"{result['minutes']:.1f} minutes; results in {arguments.output}")


if __name__ == "__main__":
    main()
