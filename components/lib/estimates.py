"""What a TPU run will take, before paying for it: samples, tokens, steps, model FLOPs, hours, cost and memory
fit. The estimate step prints it, preflight logs it for the run it checks, and ``submit --dry_run`` shows it.
Nothing here is measured on a TPU."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.base_model import (
    BaseModel,
    BaseModelChoice,
    base_model_token,
    check_base_model,
    check_positions,
)
from components.lib.corpus import HUB_PREFIX, Corpus, CorpusSpec
from components.lib.downstream_tasks import TaskSelection
from components.lib.errors import InvalidParameter
from components.lib.masked_lm import EVALUATION_BATCH_SIZE, EVALUATION_MAX_BATCHES
from components.lib.memory_model import GIB, MemoryEstimate
from components.lib.modeling import SampleLength, model_config
from components.lib.recipe import ShapeKnobs
from components.lib.results import SUMMARY_FILE
from components.lib.run_shape import DEFAULT_MFU, RunShape, describe_batch_stages, settings_shape
from components.lib.shard_set import read_manifest
from components.lib.tokenization import DEFAULT_SAMPLE_BYTES, load_tokenizer
from components.lib.tpu_catalogue import (
    PRICES,
    TPU_TYPES,
    BatchSettings,
    TpuType,
    tpu_type,
)

# Tokens per byte of English text with a Unigram tokenizer trained on it: 0.312, measured on WikiText-2's
# valid.txt with a tokenizer trained on WikiText-2 (12,735 pieces). Used before any tokenizer exists (submit).
DEFAULT_TOKENS_PER_BYTE = 0.312
# Bytes of a text, for a run that reads at most ``limit`` texts a part (a first run) where none is read: 455, the
# mean of WikiText-2's valid.txt's 2,461 non-blank lines (1,119,083 bytes with their line ends). A corpus of whole
# documents has longer texts: its sample, and the data steps on it, grow with them.
ASSUMED_TEXT_BYTES = 455


@dataclass
class EstimateArguments(BaseModelChoice, SampleLength, ShapeKnobs, BatchSettings):
    model_config: str = field(default="roberta-base", metadata={"help": "As for the train step."})
    tpu_type: str = field(default="v3-8", metadata={"help": f"The TPU, one of {list(TPU_TYPES)}."})
    num_epochs: int = field(default=1, metadata={"help": "As for the train step."})
    max_steps: int = field(default=0, metadata={"help": "As for the train step (> 0 wins over num_epochs)."})
    bf16: bool = field(default=True, metadata={"help": "Mixed bfloat16, as the vertex target trains."})
    allow_tight_memory: bool = field(
        default=False, metadata={"help": "As for preflight: a tight memory estimate is no refusal."}
    )
    train_shards: str = field(default="", metadata={"help": "Training shards: their manifest gives the samples."})
    corpus: str = field(default="", metadata={"help": "Without shards: the corpus, whose size gives the samples."})
    corpus_bytes: int = field(
        default=0, metadata={"help": "The corpus's size in bytes, for an hf: corpus (see its dataset card)."}
    )
    tokenizer: str = field(
        default="",
        metadata={
            "help": "With --corpus: tokens per byte measured with it on a sample of the corpus (with init_from, the "
            "base model's tokenizer unless this is given)."
        },
    )
    holdout_fraction: float = field(
        default=0.0, metadata={"help": "Without shards: the share of the corpus held out for validation."}
    )
    vocab_size: int = field(default=25_000, metadata={"help": "Vocabulary (without shards or tokenizer)."})
    num_parts: int = field(
        default=1, metadata={"help": "Without shards: the training shards' parts, tasks side by side (as for shards)."}
    )
    limit: int = field(
        default=0,
        metadata={"help": "Without shards: the data steps read at most this many texts a part (as theirs); 0: all."},
    )
    offline: bool = field(
        default=False,
        metadata={"help": "Read nothing of the corpus (a dry run): its size is --corpus_bytes, its tokens assumed."},
    )
    mfu: float = field(default=DEFAULT_MFU, metadata={"help": "Model FLOPs utilization assumed for the hours."})
    from_run: str = field(
        default="", metadata={"help": "A previous run's training_summary.json (or model folder): its throughput."}
    )
    price_per_hour: float = field(
        default=0.0,
        metadata={"help": "The TPU's price per hour; 0: its Cloud TPU list prices (us-central1, on demand and Spot)."},
    )

    def __post_init__(self) -> None:
        self.resolve_batch(tpu_type(self.tpu_type).replicas)
        if self.num_epochs < 1:
            raise InvalidParameter("num_epochs", self.num_epochs, "must be a positive whole number")
        self.check_sample_length()  # without shards: theirs is in their manifest
        if not 0 < self.mfu <= 1:
            raise InvalidParameter("mfu", self.mfu, "must be above 0 and at most 1 (0.4 is 40%)")
        if not 0 <= self.holdout_fraction < 1:
            raise InvalidParameter("holdout_fraction", self.holdout_fraction, "must be at least 0 and below 1")
        if self.price_per_hour < 0:
            raise InvalidParameter("price_per_hour", self.price_per_hour, "must be 0 (unknown) or positive")
        if self.num_parts < 1:
            raise InvalidParameter("num_parts", self.num_parts, "must be a positive whole number")
        if self.limit < 0:
            raise InvalidParameter("limit", self.limit, "must be a positive number of texts, or 0 for all")
        if self.max_steps < 0:
            raise InvalidParameter("max_steps", self.max_steps, "must be 0 (use num_epochs) or positive")
        if not (self.train_shards or self.corpus or self.max_steps):
            raise InvalidParameter(
                "train_shards", self.train_shards, "name the training shards, or a --corpus, or give --max_steps"
            )


def shards_size(manifest: dict[str, Any], uri: str) -> dict[str, Any]:
    return {
        "samples": manifest["num_records"],
        "max_length": manifest["max_length"],
        "vocab_size": manifest["vocab_size"],
        "special_tokens": manifest["special_tokens"],
        "source": storage.join(uri, "manifest.json"),
    }


def data_size(arguments: EstimateArguments, base_tokenizer: Any = None) -> dict[str, Any]:
    """Samples, sample length and vocabulary: from the shards' manifest, else from the corpus's size, its tokens per
    byte measured with ``--tokenizer`` or else ``base_tokenizer`` (a continued model's own), else assumed."""
    if arguments.train_shards:
        return shards_size(read_manifest(arguments.train_shards, "train_shards"), arguments.train_shards)
    size: dict[str, Any] = {
        "max_length": arguments.max_length,
        "vocab_size": arguments.vocab_size,
        "special_tokens": {"pad": 1, "bos": 0, "eos": 2},
    }
    if not arguments.corpus:
        return {**size, "samples": None, "source": "--max_steps"}
    if not arguments.corpus_bytes and (arguments.offline or arguments.corpus.strip().startswith(HUB_PREFIX)):
        where = (
            "its dataset card's dataset_info"
            if arguments.corpus.strip().startswith(HUB_PREFIX)
            else "gcloud storage du -s"
        )
        raise InvalidParameter(
            "corpus_bytes", 0, f"the size of {arguments.corpus} is not read here; give it (as stored: {where})"
        )
    # a sample of the corpus is read only to measure tokens per byte, or to learn the size of its files
    corpus = None
    tokenizer = base_tokenizer
    if arguments.tokenizer and not arguments.offline:
        tokenizer = load_tokenizer(arguments.tokenizer)[0]
    if not arguments.offline and (tokenizer is not None or not arguments.corpus_bytes):
        corpus = Corpus(CorpusSpec(corpus=arguments.corpus), sample_bytes=1_000_000)
    expansion, how_expanded = 1.0, ""
    corpus_bytes = arguments.corpus_bytes
    if not corpus_bytes and corpus is not None:
        corpus_bytes, expansion = corpus.reader.estimated_text_bytes()  # compressed files: from their first MiB
        how_expanded = "measured on the first MiB of up to 8"
    elif compressed(arguments.corpus):  # the size given is the files' as stored
        expansion, how_expanded = ASSUMED_TEXT_PER_COMPRESSED_BYTE, "assumed (measured on WikiText-2)"
        corpus_bytes = int(corpus_bytes * expansion)
    if not corpus_bytes:
        raise InvalidParameter("corpus_bytes", 0, f"the size of {arguments.corpus} is not known here; give it")
    tokens_per_byte, how = DEFAULT_TOKENS_PER_BYTE, "assumed (measured on WikiText-2)"
    text_bytes, how_long = ASSUMED_TEXT_BYTES, "assumed (WikiText-2's mean line)"
    if corpus is not None and tokenizer is not None:
        texts = list(corpus)
        tokens = sum(len(ids) for ids in tokenizer(texts)["input_ids"])
        read = max(sum(len(text.encode("utf-8")) + 1 for text in texts), 1)
        tokens_per_byte = tokens / read
        how = f"measured on {len(texts):,} texts of the corpus"
        text_bytes, how_long = read / max(len(texts), 1), "their mean"
        size.update(vocab_size=len(tokenizer))
    limited = {"corpus_bytes": corpus_bytes, "limit": arguments.limit, "text_bytes": text_bytes}
    samples = bytes_read(limited, arguments.num_parts) * tokens_per_byte / arguments.max_length
    return {
        **size,
        "samples": int(samples * (1 - arguments.holdout_fraction)),
        # nothing held out: the validation corpus's size is not known here
        "validation_samples": int(samples * arguments.holdout_fraction) if arguments.holdout_fraction else None,
        **limited,
        "holdout_fraction": arguments.holdout_fraction,
        "tokens_per_byte": round(tokens_per_byte, 4),
        "source": f"{corpus_bytes:,} bytes of text x {tokens_per_byte:.3f} tokens per byte, {how}"
        + (
            f" (compressed files: {expansion:.2f} bytes of text per stored byte, {how_expanded})"
            if expansion != 1.0
            else ""
        )
        + (f", {arguments.holdout_fraction:.0%} held out" if arguments.holdout_fraction else "")
        + (
            f"; at most {arguments.limit:,} texts a part read (limit): "
            f"{bytes_read(limited, arguments.num_parts):,.0f} bytes at {text_bytes:,.0f} bytes a text, {how_long}"
            if arguments.limit
            else ""
        ),
    }


def bytes_read(data: dict[str, Any], parts: int) -> float:
    """The bytes of text that ``parts`` tasks read of the corpus: all of it, or ``limit`` texts each at most."""
    if not data["limit"]:
        return data["corpus_bytes"]
    return min(data["corpus_bytes"], data["limit"] * parts * data["text_bytes"])


def compressed(corpus: str) -> bool:
    """Whether the corpus names compressed files (by their names: a glob or list of them)."""
    return any(storage.compression(item.strip()) for item in corpus.split(","))


def estimate_run(
    arguments: EstimateArguments,
    probe: Mapping[str, Any] | None = None,
    evaluation: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the table shows, as numbers; the evaluation's given the evaluate step's settings (else its
    defaults), the downstream probe's given its settings (``probe_estimate``)."""
    tpu = tpu_type(arguments.tpu_type)
    base = None if arguments.offline else base_to_estimate(arguments)  # a dry run reads nothing of it
    data = data_size(arguments, base.tokenizer if base else None)
    if base:  # the base's model, whatever model_config says; its embeddings, whatever its tokenizer's length
        config = base.config
        check_positions(arguments.init_from, config, data["max_length"])
        data["vocab_size"] = config.vocab_size
    else:
        config = model_config(arguments.model_config, {**data, "max_length": data["max_length"]})
    shape = settings_shape(
        vars(arguments), tpu=tpu, max_length=data["max_length"], samples=data["samples"], config=config
    )
    return describe_estimate(
        shape,
        tpu,
        data,
        bf16=arguments.bf16,
        allow_tight_memory=arguments.allow_tight_memory,
        price_given=bool(arguments.price_per_hour),
        from_run=arguments.from_run,
        probe=probe,
        evaluation=evaluation or DEFAULT_EVALUATION,
        num_parts=arguments.num_parts,
        continued=bool(arguments.init_from),
    ) | {"model": model_row(arguments, base)}


def base_to_estimate(arguments: EstimateArguments) -> BaseModel | None:
    """The model a run continues (``init_from``), checked as the tokenizer step checks it; None from scratch."""
    if not arguments.init_from:
        return None
    return check_base_model(arguments.init_from, token=base_model_token(arguments.init_from))


def model_row(arguments: EstimateArguments, base: BaseModel | None) -> str:
    """What model the estimate sized: a continued model's own config, or model_config's where it was not read."""
    if base:
        return f"{arguments.init_from}, continued (its config and tokenizer)"
    if arguments.init_from:
        return f"{arguments.init_from}, continued, sized as {arguments.model_config} (a dry run reads nothing of it)"
    return arguments.model_config


def describe_estimate(
    shape: RunShape,
    tpu: TpuType,
    data: dict[str, Any],
    *,
    bf16: bool,
    allow_tight_memory: bool,
    price_given: bool,
    from_run: str = "",
    probe: Mapping[str, Any] | None = None,
    evaluation: Mapping[str, Any] | None = None,
    num_parts: int = 1,
    continued: bool = False,
) -> dict[str, Any]:
    """Everything the table shows of a run's shape on ``tpu``, as numbers: the TPU's training, and the CPU steps
    (``cpu_steps``: the data steps from a corpus, the evaluation given its settings, the probe given its, and with
    the evaluation the run report that waits for both). A ``continued`` model's tokenizer step copies the base's
    tokenizer, and its probe fine-tunes the base as well."""
    result: dict[str, Any] = {
        "data": data,
        "tpu_type": tpu.name,
        "replicas": shape.replicas,
        "global_batch_size": shape.global_batch_size,
        "per_replica_batch_size": shape.per_replica_batch_size,
        "gradient_accumulation_steps": shape.accumulation,
        "batch_stages": shape.batch_stages,
        "steps": shape.steps,
        "samples": shape.samples,
        "tokens": shape.tokens,
        "parameters": shape.parameters,
        "model_flops_per_token": shape.flops_per_token,
        "model_flops": shape.model_flops,
        "peak_flops_per_second": shape.peak_flops_per_second,
        "mfu": shape.mfu,
        "hours": shape.hours,
        "memory": memory_fit(shape.memory, tpu.name, bf16, allow_tight_memory),
        **prices(shape, tpu, given=price_given),
        "cpu_steps": data_steps(data, num_parts, trains_tokenizer=not continued),
    }
    if evaluation is not None:
        result["cpu_steps"].append(evaluation_estimate(shape, data, evaluation))
    if probe is not None:
        result["probe"] = probe_estimate(shape, probe, continued)
        result["cpu_steps"].append(result["probe"])
    if evaluation is not None:
        result["cpu_steps"].append(cpu_task("run report", 1, 0.0))  # a task's start: it writes one page
    if from_run:
        result["from_run"] = measured_rate(from_run)
        rate = result["from_run"]["model_flops_per_second_per_replica"] * shape.replicas
        result["from_run"].update(hours=shape.hours_at(rate), cost=shape.cost_at(shape.price_per_hour, rate))
    return result


def memory_fit(memory: MemoryEstimate, tpu_name: str, bf16: bool, allow_tight_memory: bool) -> dict[str, Any]:
    """One replica's memory estimate against the TPU's memory, as the estimate, preflight and submit report it, and
    why preflight would refuse the run (``refusal``; None: it would not)."""
    return {
        "low_gib": memory.low_gib,
        "high_gib": memory.high_gib,
        "available_gib": None if memory.available is None else memory.available / GIB,
        "verdict": memory.verdict,
        "largest_per_replica_batch": memory.largest_batch,
        "refusal": memory.refusal(tpu_name, bf16, allow_tight_memory),
    }


def check_memory_fit(fit: dict[str, Any], per_replica_batch_size: int) -> None:
    """Refuses a run whose memory would not fit (``memory_fit``'s refusal) before the TPU is taken: an out-of-memory
    at XLA compile comes only after the TPU was provisioned and everything before it was paid."""
    if fit["refusal"]:
        raise InvalidParameter("per_replica_batch_size", per_replica_batch_size, fit["refusal"])


# The CPU steps, from this project's measurements on its 2-core machine (docs/benchmarks.md), which the steps' 8
# vCPUs on Vertex AI should at least match: sharding 1.9 M tokens/s end to end; the tokenizer's worst case 50 MB
# of sample in 72 s; the validation shards' read of the whole corpus to find its held-out texts, 30 MB of text a
# second (a 103 MB .jsonl.gz corpus read and 5% of it sharded in 4.3 s, the process's start included); roberta-base's
# model FLOP/s on a CPU (its fine-tuning: 343 G on 2 cores, counted as the MFU's FLOPs), for the evaluation and the
# downstream probe. Plus a start per task (a machine and the image), assumed. Priced at twice Vertex AI's
# n1-standard-4 custom-training rate in us-central1 ($0.2185 an hour, about 1.15x Compute Engine's) for 8 vCPUs.
SHARDING_TOKENS_PER_SECOND = 1.9e6
TOKENIZER_BYTES_PER_SECOND = 50e6 / 72
HOLDOUT_READ_BYTES_PER_SECOND = 30e6
CPU_MODEL_FLOPS_PER_SECOND = 343e9
CPU_TASK_START_HOURS = 3 / 60
CPU_MACHINE_PRICE_PER_HOUR = 2 * 0.2185
CPU_PRICES = "8 vCPUs at twice Vertex AI's n1-standard-4 rate of $0.2185 an hour"
CPU_MACHINE = "8 vCPUs, 32 GB"
# Bytes of text per stored byte of a compressed corpus, where the files are not read (a dry run given
# --corpus_bytes): measured on WikiText-2, 3.05 as .zst (benchmarks/results/shard_throughput_zst.json) and 3.11 as
# .jsonl.gz; other text compresses otherwise, so the estimate says it assumed it.
ASSUMED_TEXT_PER_COMPRESSED_BYTE = 3.1


# The evaluate step's defaults (components/evaluate.py's), for an estimate not given the run's
DEFAULT_EVALUATION = {"max_batches": EVALUATION_MAX_BATCHES, "batch_size": EVALUATION_BATCH_SIZE}
# The downstream probe's fine-tuning defaults: the downstream step's (components/downstream.py takes them from
# here), and with its task selection's the probe an estimate counts when not given the run's
PROBE_FINE_TUNING = {
    # roberta-base's rates (the RoBERTa paper's GLUE sweep: 1e-5 to 3e-5) and a small model's (make run's mini, and
    # a random twin, learn at 1e-3): each model's is chosen on a development split (docs/steps.md)
    "learning_rates": "2e-5,1e-4,1e-3",
    "random_init_learning_rates": "",
    "dev_fraction": 0.2,
    "epochs": 3,
    # 3 epochs of a user's 240 labelled rows are 24 steps, in which no model learns (docs/benchmarks.md)
    "min_steps": 100,
    "max_steps": 0,
    "max_train_samples": 0,
    "max_eval_samples": 0,
    "batch_size": 32,
    "seeds": "1",
}
DEFAULT_PROBE = {**vars(TaskSelection()), **PROBE_FINE_TUNING}
# The TPU job's hard limit when none is given: twice the estimated training time (the estimate assumes 40% MFU; a
# run at half that still ends) plus an hour (TPU start, XLA compiles, validation, checkpoints, the final save);
# never under 2 hours (a short run's start alone can take tens of minutes), never over Vertex AI's own default of
# 7 days, which is what an unbounded job would get.
TIMEOUT_FLOOR_HOURS, TIMEOUT_CAP_HOURS = 2.0, 168.0


def tpu_job_timeout(hours: float, estimated_hours: float) -> int:
    """The TPU job's hard limit in seconds: ``hours`` when given (refused below the estimate), else derived from
    the estimate."""
    if hours:
        if hours < estimated_hours:
            raise InvalidParameter(
                "tpu_job_timeout_hours",
                hours,
                f"is below the estimated {estimated_hours:.2f} h of training; raise it or train fewer steps",
            )
        return round(hours * 3600)
    return round(min(max(2 * estimated_hours + 1, TIMEOUT_FLOOR_HOURS), TIMEOUT_CAP_HOURS) * 3600)


def cpu_task(step: str, tasks: int, machine_hours: float, wall_hours: float | None = None) -> dict[str, Any]:
    """One CPU step of ``tasks`` tasks: their machine hours (a start each included), its cost and how long the step
    takes (``wall_hours``, for tasks side by side; else their machine hours)."""
    hours = machine_hours + tasks * CPU_TASK_START_HOURS
    wall = (wall_hours if wall_hours is not None else machine_hours) + CPU_TASK_START_HOURS
    return {
        "step": step,
        "tasks": tasks,
        "hours": hours,
        "wall_hours": wall,
        "cost": hours * CPU_MACHINE_PRICE_PER_HOUR,
    }


def data_steps(data: dict[str, Any], num_parts: int, trains_tokenizer: bool = True) -> list[dict[str, Any]]:
    """The CPU steps that make the data from the corpus, the training and the validation shards each in
    ``num_parts`` parts side by side (Vertex AI runs them at once); none when the shards exist. The validation
    shards' parts read the whole corpus between them but tokenize only what they hold out. With a limit, each task
    reads at most ``limit`` texts: the tokenizer of its sample, each part of its share. A continued model's
    tokenizer step copies the model's tokenizer (``trains_tokenizer`` False): a task's start."""
    if "corpus_bytes" not in data:
        return []
    text_bytes, tokens_per_byte = bytes_read(data, num_parts), data["tokens_per_byte"]
    held_out = data["holdout_fraction"]
    sharding = text_bytes * tokens_per_byte / SHARDING_TOKENS_PER_SECOND / 3600
    holding_out = text_bytes / HOLDOUT_READ_BYTES_PER_SECOND / 3600 + held_out * sharding
    tokenizer_sample = min(bytes_read(data, 1), DEFAULT_SAMPLE_BYTES) if trains_tokenizer else 0
    return [
        cpu_task("tokenizer", 1, tokenizer_sample / TOKENIZER_BYTES_PER_SECOND / 3600),
        cpu_task("train shards", num_parts, (1 - held_out) * sharding, (1 - held_out) * sharding / num_parts),
        cpu_task("validation shards", num_parts, holding_out, holding_out / num_parts),
        cpu_task("merge shards", 2, 0.0),
        cpu_task("preflight", 1, 0.0),
    ]


def evaluation_estimate(shape: RunShape, data: dict[str, Any], evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """Hours and cost of the evaluate step: at most ``max_batches`` batches of the validation samples (all of them
    with 0), forward only, on the CPU step's machine."""
    most = int(evaluation["max_batches"]) * int(evaluation["batch_size"])
    available = data.get("validation_samples")
    if available is None and not most:
        return {"step": "evaluate", "tasks": 1, "hours": None, "cost": None, "samples": None}
    samples = min(most or available, available if available is not None else most)
    flops = samples * shape.max_length * shape.flops_per_token / 3  # forward only: a third of a training step's
    return {**cpu_task("evaluate", 1, flops / CPU_MODEL_FLOPS_PER_SECOND / 3600), "samples": samples}


def learning_rate_grid(parameter: str, rates: str) -> list[float]:
    """The peak learning rates a probe's model is fine-tuned at to choose one: comma-separated, each positive."""
    try:
        grid = [float(rate) for rate in rates.split(",")]
    except ValueError:
        grid = []
    if not grid or not all(0 < rate < 1 and math.isfinite(rate) for rate in grid) or len(set(grid)) < len(grid):
        raise InvalidParameter(parameter, rates, "must be distinct rates between 0 and 1, comma-separated (1e-5,3e-5)")
    return grid


def probe_grids(learning_rates: str, random_init_learning_rates: str) -> tuple[list[float], list[float]]:
    """The pre-trained model's rates and its random twin's (the same when none are given for it)."""
    grid = learning_rate_grid("learning_rates", learning_rates)
    if not random_init_learning_rates.strip():
        return grid, grid
    return grid, learning_rate_grid("random_init_learning_rates", random_init_learning_rates)


def dev_samples(train_samples: int, dev_fraction: float, most_rates: int) -> int:
    """How many of a task's training samples are set aside to choose the learning rates on: none for one rate, else
    ``dev_fraction`` of them, at least one, leaving at least one to fine-tune on. Both models fine-tune on the same
    samples, so the split is carved when either model's grid (``most_rates``: the longer) has several."""
    if most_rates == 1 or train_samples < 2:
        return 0
    return min(max(round(train_samples * dev_fraction), 1), train_samples - 1)


def fine_tunings(rates: int, seeds: int) -> int:
    """One model's fine-tunings on a task: one a rate to choose among several (with the first seed), then one for
    each other seed at the chosen rate; the chosen rate's run is the first seed's."""
    return seeds if rates == 1 else rates + seeds - 1


def fine_tuning_steps(samples: int, batch_size: int, epochs: int, max_steps: int, min_steps: int) -> int:
    """Optimizer steps of one fine-tuning: ``max_steps``, else ``epochs`` passes over the samples but at least
    ``min_steps`` (a small task's few epochs are too few steps to learn anything)."""
    return max_steps or max(epochs * math.ceil(samples / min(batch_size, samples)), min_steps)


def probe_estimate(shape: RunShape, probe: Mapping[str, Any], continued: bool = False) -> dict[str, Any]:
    """Hours and cost of the downstream probe (the downstream step's settings ``probe``): each task fine-tuned from
    the model and from its random twin (and a ``continued`` model's base, at the model's rates) at each rate of their
    grids and then once for every other seed, at the
    training's length (the most a probe's sample pads to), and scored. A task's size is known here for the built-in
    one, else only where max_train_samples bounds it."""
    from components.lib.downstream_tasks import WORD_ORDER, parse_tasks, word_order_task

    seeds = len(str(probe["seeds"]).split(","))
    grids = probe_grids(str(probe["learning_rates"]), str(probe["random_init_learning_rates"]))
    grids = (*grids, grids[0]) if continued else grids  # the base chooses from the pre-trained model's rates
    runs = sum(fine_tunings(len(grid), seeds) for grid in grids)
    most_rates = max(len(grid) for grid in grids)
    batch_size, epochs, max_steps, min_steps = (
        int(probe[name]) for name in ("batch_size", "epochs", "max_steps", "min_steps")
    )
    most_train, most_eval = int(probe["max_train_samples"]), int(probe["max_eval_samples"])
    flops, unknown = 0.0, []
    for spec in parse_tasks(probe["tasks"], probe["text_columns"], probe["label_column"]):
        if spec.source == WORD_ORDER:
            task = word_order_task()
            train, validation = len(task.train.labels), len(task.validation.labels)
        elif most_train:
            train, validation = most_train, most_eval or most_train // 4
        else:
            unknown.append(spec.name)
            continue
        train, validation = min(train, most_train or train), min(validation, most_eval or validation)
        dev = dev_samples(train, float(probe["dev_fraction"]), most_rates)
        fitted = train - dev
        steps = fine_tuning_steps(fitted, batch_size, epochs, max_steps, min_steps)
        samples = steps * min(batch_size, fitted) + (validation + dev) / 3  # a third: scoring is forward only
        flops += runs * samples * shape.max_length * shape.flops_per_token
    return {
        **cpu_task("downstream probe", 1, flops / CPU_MODEL_FLOPS_PER_SECOND / 3600),
        "fine_tunings": runs,
        "unknown": unknown,
    }


def prices(shape: RunShape, tpu: TpuType, given: bool) -> dict[str, Any]:
    """The run's price and cost: the price given, else the TPU's list prices on demand and, where Vertex AI
    offers it (one host), Spot."""
    if given:
        return {"price_per_hour": shape.price_per_hour, "cost": shape.cost, "price_source": "given"}
    listed = {"price_per_hour": shape.price_per_hour, "cost": shape.cost}
    if tpu.spot_list_price_per_hour:
        spot = tpu.spot_list_price_per_hour
        listed.update(spot_price_per_hour=spot, spot_cost=shape.cost_at(spot))
    return {
        **listed,
        "price_source": f"{PRICES}; override with --price_per_hour (the pipeline parameter tpu_price_per_hour)",
    }


def measured_rate(uri: str) -> dict[str, Any]:
    """The model FLOP/s per replica that a previous run sustained at its last log point (right only for the same
    kind of accelerator: a CPU run predicts CPU hours)."""
    summary_uri = uri if uri.endswith(".json") else storage.join(uri, SUMMARY_FILE)
    if not storage.exists(summary_uri):
        raise InvalidParameter("from_run", uri, f"no {SUMMARY_FILE} there; name a finished train step's output")
    summary = json.loads(storage.read_text(summary_uri))
    if not summary.get("history"):
        raise InvalidParameter("from_run", uri, "that run logged no step to measure")
    last = summary["history"][-1]
    return {
        "run": summary_uri,
        "accelerator": f"{summary['replicas']} x {summary['accelerator']}",
        "model_flops_per_second_per_replica": last["model_tflops_per_second"] * 1e12 / summary["replicas"],
    }


def estimate_table(result: dict[str, Any]) -> str:
    """The estimate as an aligned two-column table for people."""
    data, memory = result["data"], result["memory"]
    rows = [("model", result["model"])] if "model" in result else []
    rows += [
        ("data", data["source"]),
        (
            "global batch",
            f"{result['global_batch_size']:,} ({result['replicas']} replicas of the {result['tpu_type']} x "
            f"{result['gradient_accumulation_steps']} micro-batch(es) of {result['per_replica_batch_size']})",
        ),
        ("steps", f"{result['steps']:,}"),
    ]
    if warmup := describe_batch_stages(result["batch_stages"], result["global_batch_size"]):
        rows.append(("batch warm-up", warmup))
    rows += [
        ("samples", f"{result['samples']:,} of {data['max_length']} tokens"),
        ("tokens", f"{result['tokens']:,}"),
        ("parameters", f"{result['parameters']:,}"),
        ("model FLOPs per token", f"{result['model_flops_per_token'] / 1e6:,.1f} M (6 x parameters + attention)"),
        ("model FLOPs in all", f"{result['model_flops']:.3e}"),
        ("TPU peak (bf16)", f"{result['peak_flops_per_second'] / 1e12:,.0f} TFLOP/s"),
        ("hours", f"{_hours(result['hours'])} at {result['mfu']:.0%} MFU (assumed, not measured)"),
    ]
    if "from_run" in result:
        run = result["from_run"]
        rows.append(
            (
                "hours (measured rate)",
                f"{_hours(run['hours'])} at the {run['model_flops_per_second_per_replica'] / 1e12:,.3f} TFLOP/s per "
                f"replica {run['accelerator']} measured in {run['run']}",
            )
        )
    cost = f"${result['cost']:,.2f} at ${result['price_per_hour']:,.2f} an hour"
    if "spot_cost" in result:
        cost += f" on demand, ${result['spot_cost']:,.2f} at ${result['spot_price_per_hour']:,.2f} Spot"
    elif result["price_source"] != "given":
        cost += " on demand (Vertex AI has no Spot for TPU slices of several hosts)"
    rows.append(("cost", cost))
    if "cost" in result.get("from_run", {}):
        rows.append(("cost (measured rate)", f"${result['from_run']['cost']:,.2f} on demand"))
    if result["price_source"] != "given":
        rows.append(("prices", result["price_source"]))
    rows += cpu_rows(result["cpu_steps"])
    if result["cpu_steps"]:
        before, after = cpu_wall_hours(result["cpu_steps"])
        rows.append(
            (
                "run time",
                f"about {_hours(run_hours(result))} from submit to the end: the steps before the TPU "
                f"{_hours(before)}, the training {_hours(result['hours'])}, the steps after it {_hours(after)} (the "
                f"TPU's start and any wait in its queue not counted; {RUN_TIME_BASIS})",
            )
        )
    rows.append(
        (
            "memory per replica",
            f"{memory['low_gib']:.1f}-{memory['high_gib']:.1f} GiB of {memory['available_gib']:.0f} GiB: "
            f"{memory['verdict']}; largest batch per replica that fits: {memory['largest_per_replica_batch']}",
        )
    )
    return two_columns(rows)


def two_columns(rows: list[tuple[str, str]]) -> str:
    """Rows of (name, value) as an aligned table for people."""
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


# what the run time rests on: the CPU rates measured here, a task's start assumed, the TPU at the assumed MFU
RUN_TIME_BASIS = (
    f"an estimate: a start of {CPU_TASK_START_HOURS * 60:.0f} min a task assumed, not measured on Vertex AI"
)


def run_hours(result: dict[str, Any]) -> float:
    """How long the run takes from submit to the end by the estimate ``result``: the CPU steps before the training,
    the training at the assumed MFU, the CPU steps after it; the TPU's start and any queue not counted."""
    before, after = cpu_wall_hours(result["cpu_steps"])
    return before + result["hours"] + after


def cpu_wall_hours(steps: list[dict[str, Any]]) -> tuple[float, float]:
    """How long the CPU steps hold the run up, before the training and after it: the tokenizer, then the training
    and the validation shards' parts side by side, the merges and preflight; then the evaluation and the probe side
    by side, and the run report. Steps whose size is not known count nothing."""
    wall = {step["step"]: step["wall_hours"] for step in steps if step["hours"] is not None}
    before = wall.get("tokenizer", 0.0) + max(wall.get("train shards", 0.0), wall.get("validation shards", 0.0))
    before += wall.get("merge shards", 0.0) + wall.get("preflight", 0.0)
    after = max(wall.get("evaluate", 0.0), wall.get("downstream probe", 0.0)) + wall.get("run report", 0.0)
    return before, after


def cpu_rows(steps: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The CPU steps' rows: each step's tasks, hours and cost, what was not counted, and their sum."""
    if not steps:
        return []
    rows = []
    for step in steps:
        if step["hours"] is None:
            rows.append((f"  {step['step']}", "not estimated (the size of its data is not known here)"))
            continue
        tasks = f"{step['tasks']} tasks side by side, " if step["tasks"] > 1 else ""
        detail = f"{step['samples']:,} samples" if step.get("samples") else ""
        if step.get("fine_tunings"):
            detail = f"{step['fine_tunings']} fine-tunings a task"
        if step.get("unknown"):
            detail += (
                f"; not counted: {', '.join(step['unknown'])}, whose size preflight reads (bound it with "
                "downstream_max_train_samples)"
            )
        rows.append(
            (
                f"  {step['step']}",
                f"{tasks}{_hours(step['wall_hours'])}, ${step['cost']:,.2f}" + (f" ({detail})" if detail else ""),
            )
        )
    counted = [step for step in steps if step["hours"] is not None]
    machine_hours = sum(step["hours"] for step in counted)
    rows.append(
        (
            "CPU steps in all",
            f"{_hours(machine_hours)} of {CPU_MACHINE} machines (machine time, tasks side by side counted each), "
            f"${sum(step['cost'] for step in counted):,.2f} (the "
            f"rates measured on 2 cores, a start of {CPU_TASK_START_HOURS * 60:.0f} min a task assumed; {CPU_PRICES})",
        )
    )
    return [("CPU steps", f"each task on {CPU_MACHINE}"), *rows]


def _hours(hours: float) -> str:
    return f"{hours:,.2f} h ({hours * 60:,.0f} min)" if hours < 10 else f"{hours:,.1f} h"
