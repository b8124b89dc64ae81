"""Training recipes side by side: the steps each needs to reach the reference recipe's validation loss, and its
held-out loss at the same step budget (and in FLOPs: a head sized for more masking costs more a step, a batch
warm-up's first steps read fewer samples).

Every run trains the same small RoBERTa on the same WikiText-2 shards, at the same global batch and step budget,
with the train step's own command (``python -m components.train``), and is scored by the evaluate step's command
at its fixed 15% masks. Each candidate runs with the same seeds as the reference, so a seed's runs start from the
same weights and read the same batches.

The data (``../shared/data/wikitext-2``, which holds no training split): the tokenizer and the training shards are
made from ``test.txt``; ``valid.txt`` is cut in two at an article boundary: its first half is the validation
during training (the points the steps-to-loss are read from, and the only text a recipe is chosen on), its second
half is held out for the final score.

    python benchmarks/recipes.py [--quick] [--steps 1000] [--seeds 1,2,3] [--model_config l4-h256]

The reference is the first of ``--candidates`` (``hf-2023`` by default; the default recipe when the candidates
are levers over it).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from transformers import HfArgumentParser

from components.lib.masked_lm import max_predictions
from components.lib.modeling import PRESETS, executed_flops_per_sample
from components.lib.recipe import KNOBS, highest_mlm_probability
from components.lib.run_shape import settings_shape

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"
REFERENCE = "hf-2023"
PATHS = ("tokenizer", "train_shards", "eval_shards", "output")  # where a run's data is, not what it is
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
    # the levers over the default (docs/recipes.md): clipping, and no dropout (a model whose config has some)
    "roberta-2019 + masking 30%->15% + clip 1.0": {"recipe": "roberta-2019-mask-decay", "clip_norm": 1.0},
    "roberta-2019 + masking 30%->15% + dropout 0": {"recipe": "roberta-2019-mask-decay", "dropout": 0.0},
    # the global batch as 4 micro-batches (``micro_batches``, this benchmark's: per_replica_batch_size is the batch
    # over 4), a quarter of the steps at 1 then 2 of them
    "roberta-2019 + masking 30%->15% + batch warm-up": {
        "recipe": "roberta-2019-mask-decay",
        "batch_warmup_fraction": 0.25,
        "micro_batches": 4,
    },
    "roberta-2019 + masking 30%->15% + wsd": {
        "recipe": "roberta-2019",
        "mlm_probability": 0.3,
        "final_mlm_probability": 0.15,
        "lr_schedule": "wsd",
        "decay_fraction": 0.2,
    },
}


# The second size: 4 layers of 256 (twice mini's depth and width, about 5x its training FLOPs a sample), with
# roberta-base's dropout, 0.1; mini has none
MODELS = {
    "l4-h256": {
        **PRESETS["roberta-base"],
        **{"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
    }
}


@dataclass
class RecipeBenchmarkArguments:
    candidates: str = field(
        default=",".join(list(CANDIDATES)[:4]),
        # argparse expands % in help texts: the names' own (30%->15%) are doubled
        metadata={
            "help": f"Recipes compared, comma-separated, of {list(CANDIDATES)}; the first is the reference the "
            "others are timed to (hf-2023; the default recipe to compare levers over it).".replace("%", "%%")
        },
    )
    seeds: str = field(default="1,2,3", metadata={"help": "Seeds, comma-separated; each recipe runs with each."})
    quick: bool = field(default=False, metadata={"help": "One seed (the first)."})
    steps: int = field(default=1000, metadata={"help": "Optimizer steps of every run (the budget)."})
    batch_size: int = field(default=32, metadata={"help": "Global batch of every run."})
    model_config: str = field(
        default="mini", metadata={"help": f"Model of every run: a preset, or one of {list(MODELS)}."}
    )
    vocab_size: int = field(default=8000, metadata={"help": "Tokenizer pieces."})
    long_reference_steps: int = field(
        default=3000,
        metadata={
            "help": "Steps of one more reference run (the first seed), from which the steps the reference needs to "
            "reach each recipe's final loss are read; 0: none."
        },
    )
    validations: int = field(default=20, metadata={"help": "Validation points per run."})
    eval_batches: int = field(default=16, metadata={"help": "Validation batches at each point."})
    work_dir: str = field(default="", metadata={"help": "Folder for shards and runs (kept); default: a temporary one."})
    output: str = field(default="benchmarks/results/recipes.json", metadata={"help": "JSON results."})
    plot: str = field(default="docs/images/recipes.png", metadata={"help": "Validation curves; '' for none."})

    def __post_init__(self) -> None:
        unknown = [name for name in self.names if name not in CANDIDATES]
        if unknown:
            raise SystemExit(f"--candidates: unknown {unknown}; known: {list(CANDIDATES)}")
        for steps in (self.steps, self.long_reference_steps):
            if steps % self.validations:
                raise SystemExit(f"{steps} steps must be a multiple of --validations {self.validations}")
        dropout = (MODELS.get(self.model_config) or PRESETS.get(self.model_config, {})).get("hidden_dropout_prob")
        for name in self.names:
            if "dropout" in CANDIDATES[name] and dropout == 0:
                raise SystemExit(f"{name!r} sets dropout, which {self.model_config} has none of: nothing to compare")
            if self.batch_size % CANDIDATES[name].get("micro_batches", 1):
                raise SystemExit(f"{name!r} splits the batch in {CANDIDATES[name]['micro_batches']}: --batch_size")

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
    """Tokenizer and shards, made once for a vocabulary size (kept in ``work`` between runs of the benchmark)."""
    work = work / f"data-{arguments.vocab_size}"
    paths = {name: str(work / name) for name in ("tokenizer", "train", "validation", "held_out")}
    if (work / "held_out" / "manifest.json").exists():
        return paths
    work.mkdir(parents=True, exist_ok=True)
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


def model_config_flag(arguments: RecipeBenchmarkArguments, work: Path) -> str:
    """The train step's --model_config: a preset's name, or a config.json written for one of ``MODELS``."""
    if arguments.model_config not in MODELS:
        return arguments.model_config
    path = work / f"{arguments.model_config}.json"
    path.write_text(json.dumps(MODELS[arguments.model_config], indent=1) + "\n")
    return str(path)


def flops_per_sample(model_folder: Path, summary: dict[str, Any]) -> float:
    """The training FLOPs of one sample as the train step computes them, its LM head sized for the run's highest
    masking rate (modeling.executed_flops_per_sample)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_folder)
    max_length = summary["tokens"] // summary["samples"]
    predictions = max_predictions(max_length, highest_mlm_probability(SimpleNamespace(**summary["arguments"])))
    return executed_flops_per_sample(config, max_length, predictions)


def samples_at(run: dict[str, Any], step: float) -> float:
    """The samples a run had read by ``step``, a fractional one in the step it falls in (its batch warm-up's stages
    counted as the train step counts them: the run's shape from its settings)."""
    shape = settings_shape(run["arguments"], **run["shape"], samples=None)
    whole = math.floor(step)
    before = shape.samples_before(whole)
    return before + (step - whole) * (shape.samples_before(whole + 1) - before)


def train_and_score(
    name: str,
    candidate: dict[str, Any],
    seed: int,
    steps: int,
    data: dict[str, str],
    arguments: RecipeBenchmarkArguments,
    work: Path,
) -> dict[str, Any]:
    """One run of the train step with ``candidate``'s settings (``CANDIDATES``' form) and its score by the evaluate
    step (a run already in ``work`` is read back). ``arguments``: the run's sizes (model, vocabulary, batch,
    validations)."""
    shape = f"{arguments.model_config}-vocab{arguments.vocab_size}-batch{arguments.batch_size}-{steps}steps"
    folder = work / shape / f"{re.sub('[^a-z0-9]+', '-', name.lower())}-{seed}"
    summary_file = folder / "model" / "training_summary.json"
    every = steps // arguments.validations
    candidate = dict(candidate)
    micro_batches = candidate.pop("micro_batches", 1)
    settings = {
        "tokenizer": data["tokenizer"],
        "train_shards": data["train"],
        "eval_shards": data["validation"],
        "model_config": model_config_flag(arguments, work),
        "per_replica_batch_size": arguments.batch_size // micro_batches,
        "gradient_accumulation_steps": micro_batches,
        "max_steps": steps,
        "seed": seed,
        "checkpoint_every_steps": every,
        "log_every_steps": every,
        "eval_batches": arguments.eval_batches * micro_batches,  # the same validation samples at any micro-batch
        "output": str(folder / "model"),
        **candidate,
    }
    if not summary_file.exists():  # a benchmark stopped half-way goes on from its last finished run
        folder.mkdir(parents=True, exist_ok=True)
        run("components.train", settings, folder / "train.log")
    summary = json.loads(summary_file.read_text())
    stale = {
        key: value
        for key, value in settings.items()
        if key not in PATHS and str(summary["arguments"].get(key, value)) != str(value)
    }
    if stale:
        raise SystemExit(f"{folder} was trained with other settings than {stale}: give another --work_dir")
    if summary["replicas"] != 1:
        raise SystemExit(f"{folder}: trained on {summary['replicas']} replicas; the batch compared is one replica's")
    metrics_file = folder / "evaluation" / "metrics.json"
    if not metrics_file.exists():
        flags = {"model": folder / "model", "shards": data["held_out"], "train_shards": data["train"]}
        run("components.evaluate", {**flags, "output": folder / "evaluation"}, folder / "evaluate.log")
    metrics = json.loads(metrics_file.read_text())
    return {
        "recipe": name,
        "seed": seed,
        "steps": steps,
        "settings": {key: value for key, value in summary["arguments"].items() if key in ("recipe", *KNOBS)},
        "curve": validation_curve(summary),
        "held_out_loss": metrics["loss"],
        "held_out_perplexity": metrics["perplexity"],
        "held_out_masked_accuracy": metrics["masked_accuracy"],
        "unigram_perplexity": metrics["unigram_perplexity"],
        "samples_per_second": statistics.median(point["samples_per_second"] for point in summary["history"]),
        # what the run's shape is made from (samples_at): its settings, and what only its summary knows
        "arguments": summary["arguments"],
        "shape": {"replicas": summary["replicas"], "max_length": summary["tokens"] // summary["samples"]},
        "flops_per_sample": flops_per_sample(folder / "model", summary),
    }


def compare(runs: list[dict[str, Any]], names: list[str], steps: int, long: dict[str, Any] | None) -> list[dict]:
    """Each recipe's steps to the reference's final validation loss (of the same seed) as a share of the budget,
    its held-out figures, and the steps the reference run over a longer budget needs to reach the recipe's final
    validation loss (``long``, the first seed's); means over seeds."""
    references = {run["seed"]: run for run in runs if run["recipe"] == names[0]}

    def flops(run: dict[str, Any], step: float) -> float:
        return run["flops_per_sample"] * samples_at(run, step)

    rows = []
    for name in names:
        mine = [run for run in runs if run["recipe"] == name]
        reached = [steps_to_reach(run["curve"], references[run["seed"]]["curve"][-1][1]) for run in mine]
        ratios = [None if value is None else value / steps for value in reached]
        known = [ratio for ratio in ratios if ratio is not None]
        # FLOPs against the reference's budget: a head sized for more masking costs more a sample, a batch warm-up's
        # first steps read fewer samples
        flops_ratios = [
            None if value is None else flops(run, value) / flops(references[run["seed"]], steps)
            for run, value in zip(mine, reached, strict=True)
        ]
        per_sample = mine[0]["flops_per_sample"] / references[mine[0]["seed"]]["flops_per_sample"]
        first = next(run for run in mine if run["seed"] == mine[0]["seed"])
        reference_needs = None if long is None else steps_to_reach(long["curve"], first["curve"][-1][1])
        rows.append(
            {
                "recipe": name,
                "seeds": len(mine),
                "steps_ratio_mean": statistics.mean(known) if len(known) == len(mine) else None,
                "steps_ratio_worst": max(known) if len(known) == len(mine) else None,
                "steps_ratios": ratios,
                "flops_ratio_mean": statistics.mean(flops_ratios) if len(known) == len(mine) else None,
                "flops_per_sample_over_reference": per_sample,
                "reference_steps_ratio": None if reference_needs is None else reference_needs / steps,
                "final_validation_loss_mean": statistics.mean(run["curve"][-1][1] for run in mine),
                "held_out_loss_mean": statistics.mean(run["held_out_loss"] for run in mine),
                "held_out_loss_spread": max(r["held_out_loss"] for r in mine) - min(r["held_out_loss"] for r in mine),
                "held_out_masked_accuracy_mean": statistics.mean(run["held_out_masked_accuracy"] for run in mine),
                "held_out_perplexity_over_unigram": statistics.mean(
                    run["held_out_perplexity"] / run["unigram_perplexity"] for run in mine
                ),
                "samples_per_second_median": statistics.median(run["samples_per_second"] for run in mine),
            }
        )
    return rows


def table(rows: list[dict[str, Any]], steps: int, long_steps: int) -> str:
    def ratio(value: float | None) -> str:
        return "not reached" if value is None else f"{value:.2f}"

    def reference_needs(value: float | None) -> str:
        if not long_steps:
            return "-"
        return f"more than {long_steps / steps:.0f}x" if value is None else f"{value:.2f}x"

    lines = [
        "| recipe | steps to the reference's final loss: mean, worst (each seed) | FLOPs to it (a sample's FLOPs "
        "/ the reference's) | the reference's steps to this "
        f"recipe's final loss ({f'at a {long_steps:,}-step budget, first seed' if long_steps else 'no longer run'}) | "
        "final validation loss | held-out loss "
        "(spread) | held-out masked accuracy | held-out perplexity / unigram | training samples/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        each = ", ".join(ratio(value) for value in row["steps_ratios"])
        lines.append(
            f"| `{row['recipe']}` | {ratio(row['steps_ratio_mean'])}, {ratio(row['steps_ratio_worst'])} ({each}) | "
            f"{ratio(row['flops_ratio_mean'])} ({row['flops_per_sample_over_reference']:.3f}) | "
            f"{reference_needs(row['reference_steps_ratio'])} | "
            f"{row['final_validation_loss_mean']:.3f} | {row['held_out_loss_mean']:.3f} "
            f"({row['held_out_loss_spread']:.3f}) | {row['held_out_masked_accuracy_mean']:.3f} | "
            f"{row['held_out_perplexity_over_unigram']:.3f} | {row['samples_per_second_median']:.0f} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], names: list[str], long: dict[str, Any] | None, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.2))
    for color, name in enumerate(names):
        for index, run in enumerate(run for run in runs if run["recipe"] == name):
            steps, losses = zip(*run["curve"], strict=True)
            axes.plot(steps, losses, color=f"C{color}", alpha=0.8, label=name if index == 0 else None)
    if long is not None:
        steps, losses = zip(*long["curve"], strict=True)
        axes.plot(steps, losses, color="C0", linestyle="--", label=f"{names[0]} over {long['steps']:,} steps")
    lowest = min(loss for run in runs for _, loss in run["curve"])
    highest = max(run["curve"][-1][1] for run in runs)
    axes.set_ylim(lowest - 0.05, highest + 0.4)  # where the recipes part, not the first steps' fall
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("validation loss (15% masks)")
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main() -> None:
    (arguments,) = HfArgumentParser(RecipeBenchmarkArguments, allow_abbrev=False).parse_args_into_dataclasses()
    if not (WIKITEXT / "valid.txt").exists():
        raise SystemExit(f"this benchmark reads WikiText-2 from {WIKITEXT}")
    work = Path(arguments.work_dir or tempfile.mkdtemp(prefix="recipes-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = prepare_data(work, arguments)

    def scored(name: str, seed: int, steps: int) -> dict[str, Any]:
        print(f"[{time.perf_counter() - started:6.0f} s] {name}, seed {seed}, {steps} steps", flush=True)
        result = train_and_score(name, CANDIDATES[name], seed, steps, data, arguments, work)
        print(f"         held-out loss {result['held_out_loss']:.4f}", flush=True)
        return result

    runs = [scored(name, seed, arguments.steps) for seed in arguments.seed_list for name in arguments.names]
    long = None
    if arguments.long_reference_steps:
        long = scored(arguments.names[0], arguments.seed_list[0], arguments.long_reference_steps)
    rows = compare(runs, arguments.names, arguments.steps, long)
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
        "long_reference": long,
    }
    Path(arguments.output).parent.mkdir(parents=True, exist_ok=True)
    Path(arguments.output).write_text(json.dumps(result, indent=1) + "\n")
    if arguments.plot:
        plot(runs, arguments.names, long, arguments.plot, setup.replace("`", ""))
    print(setup)
    print(table(rows, arguments.steps, arguments.long_reference_steps))
    print(f"{result['minutes']:.1f} minutes; results in {arguments.output}")


if __name__ == "__main__":
    main()
