"""What continuing a model's pre-training (``--init_from``) is for, at this machine's scale: a ``mini`` model
pre-trained on the embedded corpus (the base), continued on WikiText-2 for N steps, against the same ``mini``
trained from scratch on WikiText-2 for the same N steps (same recipe, rate and batch), and against the base as it
was: each one's masked-LM loss on held-out WikiText-2 text, and the paired differences on the same masks
(``components.compare``), seeds 1-3, with the training FLOPs each model has had; and, for the first seed, the model
trained from scratch on WikiText-2 for as many steps as the base and its continuation together (the same FLOPs).
And the downstream probe on a word-order task built from WikiText-2 text that no run trained on (the first half of
``valid.txt``), at ``make run``'s probe settings, the run's seed: a continued model's probe fine-tunes the base as
it was beside it and its random twin (the pipeline's three models), a from-scratch model's its twin.

Every model uses the base's tokenizer (a Unigram tokenizer of the embedded corpus, as ``make run`` trains one), so
that their losses are over the same tokens: a from-scratch run of one's own would train a tokenizer of its corpus.
WikiText-2's ``test.txt`` is the text continued on; the second half of ``valid.txt`` is held out.

    python benchmarks/continued_pretraining.py [--base_steps 2000] [--steps 300] [--seeds 1,2,3]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from transformers import HfArgumentParser  # noqa: E402

from components.compare import CompareArguments, compare  # noqa: E402
from components.downstream import DownstreamArguments, downstream  # noqa: E402
from components.lib.downstream_tasks import word_order_task  # noqa: E402
from components.lib.recipe import DEFAULT_RECIPE  # noqa: E402
from components.shards import ShardArguments, write_shards  # noqa: E402
from components.tokenizer import TokenizerArguments, train_tokenizer  # noqa: E402
from components.train import TrainArguments, train  # noqa: E402
from pipelines.run_local import LOCAL_DEFAULTS  # noqa: E402

WIKITEXT = PROJECT.parent / "shared" / "data" / "wikitext-2"


@dataclass
class BenchmarkArguments:
    base_steps: int = field(default=2000, metadata={"help": "Steps of the base's pre-training on the embedded corpus."})
    steps: int = field(default=300, metadata={"help": "Steps on WikiText-2, continued and from scratch alike."})
    seeds: str = field(default="1,2,3", metadata={"help": "Seeds of the WikiText-2 runs."})
    learning_rate: float = field(
        default=LOCAL_DEFAULTS["learning_rate"], metadata={"help": "Peak rate of every run (make run's)."}
    )
    output: str = field(default="benchmarks/results/continued_pretraining.json", metadata={"help": "JSON results."})


def shards(work: Path, tokenizer: str, name: str, corpus: str) -> str:
    output = str(work / name)
    write_shards(
        ShardArguments(output=output, tokenizer=tokenizer, corpus=corpus, max_length=LOCAL_DEFAULTS["max_length"])
    )
    return output


def trained(work: Path, name: str, tokenizer: str, train_shards: str, steps: int, seed: int, **settings) -> dict:
    """The train step at make run's model, batch and recipe; returns its summary with the model folder."""
    output = str(work / name)
    print(f"training {name}: {steps} steps", flush=True)
    summary = train(
        TrainArguments(
            output=output,
            tokenizer=tokenizer,
            train_shards=train_shards,
            model_config=LOCAL_DEFAULTS["model_config"],
            recipe=DEFAULT_RECIPE,  # both runs alike: a continued run's own default would be dapt-2020
            per_replica_batch_size=LOCAL_DEFAULTS["per_replica_batch_size"],
            warmup_fraction=LOCAL_DEFAULTS["warmup_fraction"],
            max_steps=steps,
            seed=seed,
            accelerator="cpu",
            log_every_steps=max(steps // 4, 1),
            checkpoint_every_steps=steps,
            **settings,
        )
    )
    flops = summary["model_flops_per_step"] * summary["total_steps"]
    return {"model": output, "flops": flops, "seconds": summary["seconds_this_run"], "last_loss": summary["last_loss"]}


def paired(work: Path, model: str, baseline: str, held_out: str) -> dict:
    """``model`` minus ``baseline`` on the held-out shards' fixed masks, with the paired error."""
    result = compare(CompareArguments(model=model, baseline=baseline, shards=held_out, output=str(work / "compare")))
    keys = ("model_loss", "baseline_loss", "difference", "paired_standard_error", "z", "samples", "masked_tokens")
    return {key: result[key] for key in keys}


def word_order_folder(work: Path, text: list[str]) -> str:
    """The word-order task of ``text``'s sentences (WikiText's " . " ends them) as a task folder the probe reads."""
    sentences = [
        sentence.strip() + " ."
        for line in text
        if line.strip() and not line.strip().startswith("=")
        for sentence in line.split(" . ")
        if len(sentence.split()) >= 8
    ]
    task = word_order_task(sentences=sentences)
    folder = work / "wikitext-word-order"
    folder.mkdir()
    for split, examples in (("train", task.train), ("validation", task.validation)):
        rows = [{"text": text[0], "label": label} for text, label in zip(examples.texts, examples.labels, strict=True)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(folder)


def probed(work: Path, model: str, task: str, seed: int) -> dict:
    """The probe's scores of ``model`` (and of its twin, and a continued model's base) on ``task``, make run's
    probe settings, one seed."""
    settings = {key.removeprefix("downstream_"): value for key, value in LOCAL_DEFAULTS.items() if "downstream" in key}
    output = str(work / "probe" / Path(model).name)
    arguments = DownstreamArguments(model=model, output=output, tasks=task, **{**settings, "seeds": str(seed)})
    (result,) = downstream(arguments)["tasks"]
    scores = {
        name: {"score": figures["score"], "standard_error": figures["standard_error"], "signal": figures["signal"]}
        for name, figures in result.items()
        if isinstance(figures, dict) and "score" in figures
    }
    return {"scores": scores, "baselines": result["baselines"], "validation_samples": result["validation_samples"]}


def main() -> None:
    (arguments,) = HfArgumentParser(BenchmarkArguments).parse_args_into_dataclasses()
    if not (WIKITEXT / "valid.txt").exists():
        raise SystemExit(f"this benchmark reads WikiText-2 from {WIKITEXT}")
    started = time.perf_counter()
    seeds = [int(seed) for seed in arguments.seeds.split(",")]
    rate = {"learning_rate": arguments.learning_rate}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        tokenizer = str(work / "tokenizer")
        train_tokenizer(
            TokenizerArguments(output=tokenizer, corpus="embedded", vocab_size=LOCAL_DEFAULTS["vocab_size"])
        )
        lines = (WIKITEXT / "valid.txt").read_text(encoding="utf-8").splitlines()
        (work / "held-out.txt").write_text("\n".join(lines[len(lines) // 2 :]) + "\n", encoding="utf-8")
        held_out = shards(work, tokenizer, "held-out-shards", str(work / "held-out.txt"))
        task = word_order_folder(work, lines[: len(lines) // 2])
        wikitext = shards(work, tokenizer, "wikitext-shards", str(WIKITEXT / "test.txt"))
        embedded = shards(work, tokenizer, "embedded-shards", "embedded")
        base = trained(work, "base", tokenizer, embedded, arguments.base_steps, 0, **rate)
        runs = []
        for seed in seeds:
            continued = trained(
                work, f"continued-{seed}", tokenizer, wikitext, arguments.steps, seed, init_from=base["model"], **rate
            )
            scratch = trained(work, f"scratch-{seed}", tokenizer, wikitext, arguments.steps, seed, **rate)
            runs.append(
                {
                    "seed": seed,
                    "continued_minus_scratch": paired(work, continued["model"], scratch["model"], held_out),
                    "continued_minus_base": paired(work, continued["model"], base["model"], held_out),
                    "continued_probe": probed(work, continued["model"], task, seed),
                    "scratch_probe": probed(work, scratch["model"], task, seed),
                    "continued": continued,
                    "scratch": scratch,
                }
            )
            print(json.dumps(runs[-1]["continued_minus_scratch"]), flush=True)
        base_alone = paired(work, base["model"], runs[0]["scratch"]["model"], held_out)
        # the same compute spent on WikiText-2 alone: from scratch for the base's steps and the continuation's
        matched_steps = arguments.base_steps + arguments.steps
        matched = trained(work, "scratch-matched", tokenizer, wikitext, matched_steps, seeds[0], **rate)
        continued_minus_matched = paired(work, str(work / f"continued-{seeds[0]}"), matched["model"], held_out)
        del matched["model"]
    for run in runs:  # the folders were temporary
        for model in ("continued", "scratch"):
            del run[model]["model"]
    output = {
        "arguments": asdict(arguments),
        "run_local": LOCAL_DEFAULTS,
        "cores": os.cpu_count(),
        "seconds": round(time.perf_counter() - started),
        "base": {key: value for key, value in base.items() if key != "model"},
        "base_minus_scratch_seed_1": base_alone,
        "scratch_with_the_same_flops": {"steps": matched_steps, **matched},
        "continued_minus_scratch_with_the_same_flops_seed_1": continued_minus_matched,
        "runs": runs,
    }
    Path(arguments.output).write_text(json.dumps(output, indent=2) + "\n")
    differences = [run["continued_minus_scratch"]["difference"] for run in runs]
    print(
        f"held-out loss, continued minus from scratch after {arguments.steps} steps: "
        + ", ".join(f"{value:+.3f}" for value in differences)
        + f" (mean {statistics.mean(differences):+.3f}); the base as it was: {base_alone['model_loss']:.3f}, "
        f"from scratch (seed {seeds[0]}): {base_alone['baseline_loss']:.3f}; from scratch for {matched_steps} steps "
        f"(the same FLOPs): {continued_minus_matched['baseline_loss']:.3f}"
    )


if __name__ == "__main__":
    main()
