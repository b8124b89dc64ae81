"""A run's shape: its replicas and batch (and the batch warm-up's stages), the steps it takes, the samples and
tokens it reads, the model FLOPs they cost, one replica's memory, and the hours and cost on a known accelerator.
Pure arithmetic (no TensorFlow, no I/O), built by ``run_shape`` alone (from a run's settings: ``settings_shape``): the
train step, preflight, the estimate, submit and the smoke test read it, so that no two of them can count a run
differently."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.lib.errors import InvalidParameter
from components.lib.masked_lm import max_predictions
from components.lib.memory_model import MemoryEstimate, training_memory
from components.lib.modeling import count_parameters, training_flops_per_token
from components.lib.recipe import highest_mlm_probability, resolve_recipe
from components.lib.tpu_catalogue import TpuType

# An assumption, not a measurement: PaLM (Chowdhery et al. 2022, table 3) reports 46.2% model FLOPs
# utilization training on TPU v4; a 125M-parameter encoder at sequence length 128 reaches less.
DEFAULT_MFU = 0.40


@dataclass(frozen=True)
class RunShape:
    replicas: int
    per_replica_batch_size: int  # samples per replica per micro-batch
    accumulation: int  # micro-batches per optimizer step
    max_length: int  # tokens per sample
    steps: int  # optimizer steps
    parameters: int = 0  # the model's trainable parameters (0: no model given)
    flops_per_token: float = 0.0  # model FLOPs of one training token
    memory: MemoryEstimate | None = None  # one replica's, with the accelerator's memory when it is known
    peak_flops_per_second: float | None = None  # all replicas' dense bf16 peak, when the accelerator is known
    mfu: float = DEFAULT_MFU  # model FLOPs utilization assumed for the hours
    price_per_hour: float = 0.0  # of the accelerator; 0: not known
    batch_warmup_fraction: float = 0.0  # share of the steps at a smaller global batch (batch_stages)

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step (at the full batch, after any batch warm-up)."""
        return self.per_replica_batch_size * self.replicas * self.accumulation

    @property
    def batch_stages(self) -> tuple[tuple[int, int], ...]:
        """(first step, micro-batches a step) of each stage of the run: with a batch warm-up, 1, 2, 4, ... micro-
        batches below ``accumulation`` over equal shares of its first ``batch_warmup_fraction`` of the steps, then
        ``accumulation``; one stage without."""
        warmup = round(self.batch_warmup_fraction * self.steps)
        ramp = [2**power for power in range(math.ceil(math.log2(self.accumulation)))]
        if not (warmup and ramp):
            return ((0, self.accumulation),)
        starts = [round(warmup * index / len(ramp)) for index in range(len(ramp))]
        ends = [*starts[1:], warmup]
        stages = [(start, micro) for start, micro, end in zip(starts, ramp, ends, strict=True) if end > start]
        return (*stages, (warmup, self.accumulation))

    def accumulation_at(self, step: int) -> int:
        """Micro-batches summed into optimizer step ``step`` (0-based)."""
        return next(micro for start, micro in reversed(self.batch_stages) if step >= start)

    def next_stage_start(self, step: int) -> int:
        """The first step of the next stage after ``step`` (the run's end after the last)."""
        return next((start for start, _ in self.batch_stages if start > step), self.steps)

    def micro_batches_before(self, step: int) -> int:
        """Micro-batches the first ``step`` optimizer steps read: where the training stream stands at ``step``."""
        ends = [start for start, _ in self.batch_stages[1:]] + [max(step, self.steps)]
        return sum(
            micro * max(0, min(step, end) - start) for (start, micro), end in zip(self.batch_stages, ends, strict=True)
        )

    def samples_before(self, step: int) -> int:
        return self.micro_batches_before(step) * self.micro_batch_size

    @property
    def learning_rate_scales(self) -> tuple[tuple[int, float], ...]:
        """(first step, learning-rate factor) of each stage: the square root of its batch over the full one (the
        square-root rule for Adam, Malladi et al. 2022), 1 at the full batch."""
        return tuple((start, math.sqrt(micro / self.accumulation)) for start, micro in self.batch_stages)

    @property
    def micro_batch_size(self) -> int:
        """Samples per micro-batch over all replicas: what the input streams batch."""
        return self.per_replica_batch_size * self.replicas

    @property
    def samples(self) -> int:
        """Samples the run reads (an epoch's remainder that fills no global batch is not read; a batch warm-up
        reads fewer)."""
        return self.samples_before(self.steps)

    @property
    def tokens_per_step(self) -> int:
        """At the full batch."""
        return self.global_batch_size * self.max_length

    @property
    def tokens(self) -> int:
        return self.samples * self.max_length

    @property
    def model_flops_per_sample(self) -> float:
        return self.flops_per_token * self.max_length

    @property
    def model_flops_per_step(self) -> float:
        """At the full batch."""
        return self.flops_per_token * self.tokens_per_step

    @property
    def model_flops(self) -> float:
        return self.flops_per_token * self.tokens

    def hours_at(self, flops_per_second: float) -> float:
        """Hours of training at a rate of model FLOPs (a measured one, or the assumed MFU of the peak)."""
        return self.model_flops / flops_per_second / 3600

    @property
    def hours(self) -> float | None:
        """Hours of training at the assumed MFU; None when the model or the accelerator's peak is not known."""
        if not (self.peak_flops_per_second and self.flops_per_token):
            return None
        return self.hours_at(self.mfu * self.peak_flops_per_second)

    def cost_at(self, price_per_hour: float, flops_per_second: float | None = None) -> float | None:
        """The cost at ``price_per_hour``, of the hours at the assumed MFU or at ``flops_per_second``."""
        hours = self.hours if flops_per_second is None else self.hours_at(flops_per_second)
        return None if hours is None else hours * price_per_hour

    @property
    def cost(self) -> float | None:
        return self.cost_at(self.price_per_hour) if self.price_per_hour else None


def run_shape(
    *,
    per_replica_batch_size: int,
    accumulation: int = 1,
    max_length: int,
    samples: int | None,
    num_epochs: int = 1,
    max_steps: int = 0,
    replicas: int = 0,
    tpu: TpuType | None = None,
    config: Any = None,
    bf16: bool = True,
    mlm_probability: float = 0.15,
    batch_warmup_fraction: float = 0.0,
    mfu: float = DEFAULT_MFU,
    price_per_hour: float = 0.0,
) -> RunShape:
    """The shape of a run of ``max_steps`` steps, else of ``num_epochs`` over ``samples`` training samples (None:
    not known, with ``max_steps`` given), on ``tpu`` (its replicas, peak, memory and list price) or on
    ``replicas`` of an accelerator; with a model ``config`` also its FLOPs and memory. A global batch larger than
    the data is refused, and so is a batch warm-up that has no smaller batch to start from."""
    if tpu is not None:
        if replicas and replicas != tpu.replicas:
            raise InvalidParameter("replicas", replicas, f"a {tpu.name} has {tpu.replicas} replicas")
        replicas, price_per_hour = tpu.replicas, price_per_hour or tpu.list_price_per_hour
    if replicas < 1:
        raise ValueError("run_shape needs a TPU type or a positive replica count")
    if samples is None and not max_steps:
        raise ValueError("run_shape needs the training samples or max_steps")
    shape = RunShape(replicas, per_replica_batch_size, accumulation, max_length, max_steps)
    if samples is not None and shape.global_batch_size > samples:
        raise InvalidParameter(
            "per_replica_batch_size",
            per_replica_batch_size,
            f"x {replicas} replica(s)"
            + (f" x {accumulation} micro-batches" if accumulation > 1 else "")
            + f" = global batch {shape.global_batch_size}, more than the {samples:,} training samples",
        )
    if batch_warmup_fraction and accumulation == 1:
        raise InvalidParameter(
            "batch_warmup_fraction",
            batch_warmup_fraction,
            "grows the batch by summing more micro-batches, and this run sums 1 a step: give a smaller "
            "per_replica_batch_size and more gradient_accumulation_steps (the same global batch)",
        )
    steps = max_steps or num_epochs * (samples // shape.global_batch_size)
    parameters, flops_per_token, memory = 0, 0.0, None
    if config is not None:
        parameters = count_parameters(config)
        flops_per_token = training_flops_per_token(config, parameters, max_length)
        memory = training_memory(
            config,
            parameters,
            per_replica_batch_size,
            max_length,
            bf16,
            max_predictions(max_length, mlm_probability),
            tpu.memory_gib_per_replica if tpu else None,
            accumulation,
        )
    return RunShape(
        replicas,
        per_replica_batch_size,
        accumulation,
        max_length,
        steps,
        parameters,
        flops_per_token,
        memory,
        tpu.replicas * tpu.peak_tflops_per_replica * 1e12 if tpu else None,
        mfu,
        price_per_hour,
        batch_warmup_fraction,
    )


def describe_batch_stages(stages: Any, global_batch_size: int) -> str:
    """A batch warm-up's stages for people ("" for none): "global batch 512 from step 0, ..., 2,048 from step N"."""
    if len(stages) < 2:
        return ""
    micro_batch = global_batch_size // stages[-1][1]
    return "global batch " + ", ".join(f"{micro * micro_batch:,} from step {start:,}" for start, micro in stages)


# The settings run_shape reads of a run's (the training settings' names): setting -> run_shape's keyword
SHAPE_SETTINGS = {
    "per_replica_batch_size": "per_replica_batch_size",
    "gradient_accumulation_steps": "accumulation",
    "max_length": "max_length",
    "num_epochs": "num_epochs",
    "max_steps": "max_steps",
    "bf16": "bf16",
    "mfu": "mfu",
    "price_per_hour": "price_per_hour",
}


def settings_shape(settings: Mapping[str, Any], **known: Any) -> RunShape:
    """``run_shape`` of a run's settings (``vars`` of the train step's, the estimate's, the smoke test's: those of
    ``SHAPE_SETTINGS`` they have, and the highest masking rate of their recipe), with what only the caller knows
    (the data, the accelerator, the model) and any of run_shape's keywords given as ``known``, which win. The
    recipe's knobs that change the shape (``ShapeKnobs``) are read resolved."""
    given = {keyword: settings[name] for name, keyword in SHAPE_SETTINGS.items() if name in settings}
    recipe = resolve_recipe(settings)
    knobs = {"mlm_probability": highest_mlm_probability(recipe), "batch_warmup_fraction": recipe.batch_warmup_fraction}
    return run_shape(**{**given, **knobs, **known})
