"""Do the default recipe's claims survive a learning-rate search? Each recipe's peak rate is tuned on the validation
split (a grid of three around its own rate, a factor apart, widened while the best is at an edge), then the default
recipe at a share of the steps (0.5: its own full schedule over them) is compared with ``hf-2023`` at the whole
budget, each at its tuned rate, on three seeds: held-out loss, masked accuracy, and the paired difference of the
two models on the same masks (``components.compare``: the per-sample difference and its error), with the FLOPs
each spent beside the steps.

The setup is ``benchmarks/recipes.py``'s (its functions: the same shards, the train step's and the evaluate step's
commands, a run already trained read back): WikiText-2's ``test.txt`` to train on, the first half of ``valid.txt``
to choose the rates on (the train step's validation), the second half held out for every figure reported.

    python benchmarks/recipes_tuned.py [--steps 1000] [--default_share 0.5] [--seeds 1,2,3] [--work_dir DIR]
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recipes import WIKITEXT, prepare_data, run, samples_at, train_and_score
from transformers import HfArgumentParser

from components.lib.job_runner import DIVERGED_EXIT
from components.lib.recipe import RECIPES


@dataclass
class TunedRecipesArguments:
    default: str = field(default="roberta-2019-mask-decay-clip", metadata={"help": "The recipe whose claim is tested."})
    reference: str = field(default="hf-2023", metadata={"help": "The recipe it is claimed to beat."})
    steps: int = field(default=1000, metadata={"help": "The reference's optimizer steps (the budget)."})
    default_share: float = field(default=0.5, metadata={"help": "The default's steps, as a share of the budget."})
    grid_factor: float = field(default=2.0, metadata={"help": "Between neighbouring rates of a grid."})
    most_widenings: int = field(default=4, metadata={"help": "Rates added at most past a grid's edge."})
    seeds: str = field(default="1,2,3", metadata={"help": "Seeds of the comparison; the first tunes the rates."})
    batch_size: int = field(default=32, metadata={"help": "Global batch of every run."})
    model_config: str = field(default="mini", metadata={"help": "Model of every run (recipes.py's choices)."})
    vocab_size: int = field(default=8000, metadata={"help": "Tokenizer pieces."})
    validations: int = field(default=20, metadata={"help": "Validation points per run."})
    eval_batches: int = field(default=16, metadata={"help": "Validation batches at each point."})
    work_dir: str = field(default="", metadata={"help": "Folder for shards and runs (kept); default: a temporary one."})
    output: str = field(default="benchmarks/results/recipes_tuned.json", metadata={"help": "JSON results."})

    def __post_init__(self) -> None:
        for name in (self.default, self.reference):
            if name not in RECIPES:
                raise SystemExit(f"{name!r}: not a recipe of {list(RECIPES)}")
        if not 0 < self.default_share <= 1 or self.steps * self.default_share % self.validations:
            raise SystemExit(f"--default_share {self.default_share}: its steps must be a multiple of --validations")
        if self.steps % self.validations:
            raise SystemExit(f"--steps {self.steps}: must be a multiple of --validations {self.validations}")

    @property
    def seed_list(self) -> list[int]:
        return [int(seed) for seed in self.seeds.split(",")]


def rate_name(recipe: str, rate: float) -> str:
    return f"{recipe} at {rate:.3g}"


def tuned_rate(recipe: str, steps: int, train: Any, arguments: TunedRecipesArguments) -> tuple[float, list[dict]]:
    """The peak rate with the lowest final validation loss (first seed) on a grid around the recipe's own, widened
    one rate at a time past an edge that holds the best; a run that diverges (the train step stops it) is the worst.
    Returns the rate and each rate's loss."""
    own = RECIPES[recipe]["learning_rate"]
    losses: dict[float, float] = {}

    def validation_loss(rate: float) -> float:
        if rate not in losses:
            try:
                scored = train(rate_name(recipe, rate), {"recipe": recipe, "learning_rate": rate}, steps)
                losses[rate] = scored["curve"][-1][1]
            except SystemExit as stopped:
                if f"failed ({DIVERGED_EXIT})" not in str(stopped):
                    raise
                print(f"         diverged: {stopped}", flush=True)  # the train step stopped on a non-finite loss
                losses[rate] = math.inf
        return losses[rate]

    grid = [own / arguments.grid_factor, own, own * arguments.grid_factor]
    for rate in grid:
        validation_loss(rate)
    for _ in range(arguments.most_widenings):
        best = min(losses, key=losses.get)
        if best == min(losses):
            validation_loss(best / arguments.grid_factor)
        elif best == max(losses):
            validation_loss(best * arguments.grid_factor)
        else:
            break
    search = [{"learning_rate": rate, "validation_loss": loss} for rate, loss in sorted(losses.items())]
    return min(losses, key=losses.get), search


def paired(model: Path, baseline: Path, shards: str, output: Path) -> dict[str, Any]:
    """``components.compare`` of two models on the held-out shards' fixed masks."""
    if not (output / "comparison.json").exists():
        flags = {"model": model, "baseline": baseline, "shards": shards, "output": output}
        run("components.compare", flags, output.with_suffix(".log"))
    return json.loads((output / "comparison.json").read_text())


def main() -> None:
    (arguments,) = HfArgumentParser(TunedRecipesArguments, allow_abbrev=False).parse_args_into_dataclasses()
    if not (WIKITEXT / "valid.txt").exists():
        raise SystemExit(f"this benchmark reads WikiText-2 from {WIKITEXT}")
    work = Path(arguments.work_dir or tempfile.mkdtemp(prefix="recipes-tuned-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = prepare_data(work, arguments)
    default_steps = round(arguments.steps * arguments.default_share)
    budgets = {arguments.reference: arguments.steps, arguments.default: default_steps}

    def train(name: str, candidate: dict[str, Any], steps: int, seed: int = arguments.seed_list[0]) -> dict[str, Any]:
        print(f"[{time.perf_counter() - started:6.0f} s] {name}, seed {seed}, {steps} steps", flush=True)
        scored = train_and_score(name, candidate, seed, steps, data, arguments, work)
        print(f"         validation loss {scored['curve'][-1][1]:.4f}", flush=True)
        return scored

    searches, runs = {}, {}
    for recipe, steps in budgets.items():
        rate, searches[recipe] = tuned_rate(recipe, steps, train, arguments)
        candidate = {"recipe": recipe, "learning_rate": rate}
        runs[recipe] = [train(rate_name(recipe, rate), candidate, steps, seed) for seed in arguments.seed_list]

    def folder(scored: dict[str, Any]) -> Path:
        return Path(scored["arguments"]["output"])

    def flops(scored: dict[str, Any]) -> float:
        return scored["flops_per_sample"] * samples_at(scored, scored["steps"])

    pairs = []
    for default, reference in zip(runs[arguments.default], runs[arguments.reference], strict=True):
        comparison = paired(folder(default), folder(reference), data["held_out"], work / f"compare-{default['seed']}")
        pairs.append(
            {
                "seed": default["seed"],
                "loss_difference": comparison["difference"],
                "standard_error": comparison["paired_standard_error"],
                "flops_ratio": flops(default) / flops(reference),
            }
        )
    rows = [
        {
            "recipe": recipe,
            "steps": budgets[recipe],
            "learning_rate": runs[recipe][0]["arguments"]["learning_rate"],
            "search": searches[recipe],
            "held_out_losses": [scored["held_out_loss"] for scored in runs[recipe]],
            "held_out_loss_mean": statistics.mean(scored["held_out_loss"] for scored in runs[recipe]),
            "held_out_loss_stdev": statistics.stdev(scored["held_out_loss"] for scored in runs[recipe]),
            "held_out_masked_accuracy_mean": statistics.mean(s["held_out_masked_accuracy"] for s in runs[recipe]),
            "held_out_perplexity_over_unigram": statistics.mean(
                s["held_out_perplexity"] / s["unigram_perplexity"] for s in runs[recipe]
            ),
            "flops": statistics.mean(flops(scored) for scored in runs[recipe]),
        }
        for recipe in budgets
    ]
    result = {
        "command": "python " + " ".join(sys.argv),
        "arguments": asdict(arguments),
        "minutes": (time.perf_counter() - started) / 60,
        "rows": rows,
        "pairs": pairs,
        "runs": runs,
    }
    Path(arguments.output).parent.mkdir(parents=True, exist_ok=True)
    Path(arguments.output).write_text(json.dumps(result, indent=1) + "\n")
    print(table(rows, pairs, arguments))
    print(f"{result['minutes']:.1f} minutes; results in {arguments.output}")


def table(rows: list[dict[str, Any]], pairs: list[dict[str, Any]], arguments: TunedRecipesArguments) -> str:
    lines = [
        "| recipe | steps | tuned peak rate (validation loss at each rate) | held-out loss (each seed) | "
        "held-out masked accuracy | held-out perplexity / unigram | training FLOPs |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        search = ", ".join(f"{point['learning_rate']:.3g}: {point['validation_loss']:.3f}" for point in row["search"])
        each = ", ".join(f"{loss:.3f}" for loss in row["held_out_losses"])
        lines.append(
            f"| `{row['recipe']}` | {row['steps']:,} | **{row['learning_rate']:.3g}** ({search}) | "
            f"{row['held_out_loss_mean']:.3f} ({each}) | {row['held_out_masked_accuracy_mean']:.3f} | "
            f"{row['held_out_perplexity_over_unigram']:.3f} | {row['flops']:.3g} |"
        )
    differences = ", ".join(
        f"seed {pair['seed']}: {pair['loss_difference']:+.4f} ± {pair['standard_error']:.4f}" for pair in pairs
    )
    lines.append(
        f"\n`{arguments.default}` minus `{arguments.reference}`, held-out loss on the same masks (paired): "
        f"{differences}; FLOPs {statistics.mean(pair['flops_ratio'] for pair in pairs):.2f}x"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
