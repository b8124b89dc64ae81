"""The recipe's optimization: the settings a pre-training recipe fixes (peak learning rate, Adam's beta2 and
epsilon, gradient clipping, warmup, the schedule's shape, weight decay, dropout, the masking rate and its decay),
the batch warm-up, the named recipes, the learning-rate schedule and the optimizer (the training step that applies
it: ``train_function``).

A knob left at ``RECIPE_VALUE`` (-1, or "" for the schedule) takes the value of the run's ``--recipe``; any knob
given beside the recipe overrides it. ``hf-2023`` is the reference recipe this project started from: Hugging
Face's "train a language model with TensorFlow on TPUs" (2023), whose run is the ``tf-tpu/roberta-base-epochs-500-
no-wd`` model; ``roberta-2019`` is RoBERTa's own (fairseq's); ``roberta-2019-mask-decay`` adds a masking rate that
decays from 30% to 15%; the default, ``roberta-2019-mask-decay-clip``, clips each step's gradient to a global norm of
1.0 as well. ``dapt-2020`` continues a pre-trained model (``--init_from``), whose default it is: the domain-adaptive
pre-training of "Don't Stop Pretraining" (Gururangan et al. 2020) as its authors' repository gives the command
(docs/recipes.md has the sources and the measured comparisons)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from components.lib.errors import InvalidParameter
from components.lib.masked_lm import check_probability

RECIPE_VALUE = -1  # a knob left at this (or "" for lr_schedule) takes the recipe's value
MODEL_DROPOUT = -1.0  # a recipe's dropout that leaves the model config's own (roberta-base's 0.1)
# The reference recipe's global batch (256 per replica on a v3-8), kept on every TPU type by accumulating
# micro-batches (tpu_catalogue.default_batch)
RECIPE_GLOBAL_BATCH = 2048
SCHEDULES = ("linear", "wsd")


# Each named recipe sets every knob of Recipe (resolve_recipe refuses one left unset)
RECIPES = {
    # the reference: AdamWeightDecay at 1e-4, beta2 0.999, epsilon 1e-8, no clipping, 5% warmup then linear
    # decay, weight decay 1e-3, 15% masking (run_mlm.py's defaults in the recipe's repository)
    "hf-2023": dict(
        learning_rate=1e-4,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        clip_norm=0.0,
        warmup_fraction=0.05,
        warmup_steps=0,
        lr_schedule="linear",
        decay_fraction=0.0,
        weight_decay=1e-3,
        dropout=MODEL_DROPOUT,  # roberta-base's config: 0.1
        mlm_probability=0.15,
        final_mlm_probability=0.0,
        batch_warmup_fraction=0.0,
    ),
    # RoBERTa's own (fairseq's examples/roberta pre-training config for roberta-base at a batch of 2,048): 5e-4,
    # beta2 0.98, epsilon 1e-6, no clipping, 10k warmup updates of 125k (8%), linear decay (polynomial, power 1),
    # weight decay 0.01, 15% masking
    "roberta-2019": dict(
        learning_rate=5e-4,
        adam_beta2=0.98,
        adam_epsilon=1e-6,
        clip_norm=0.0,
        warmup_fraction=0.08,
        warmup_steps=0,
        lr_schedule="linear",
        decay_fraction=0.0,
        weight_decay=0.01,
        dropout=MODEL_DROPOUT,  # fairseq's dropout and attention_dropout 0.1, as roberta-base's config has them
        mlm_probability=0.15,
        final_mlm_probability=0.0,
        batch_warmup_fraction=0.0,
    ),
}
# roberta-2019 with a masking rate that decays linearly from 30% to 15% over the run (Ankner et al. 2023): lower
# held-out loss than roberta-2019 on every seed at the same peak in benchmarks/recipes.py (docs/recipes.md)
RECIPES["roberta-2019-mask-decay"] = {**RECIPES["roberta-2019"], "mlm_probability": 0.30, "final_mlm_probability": 0.15}
# the default: that, with each step's gradient clipped to a global norm of 1.0 (Hugging Face Trainer's default), to cap
# a spike at 5e-4 in bf16. Its values are fairseq's published ones, not a finding of this project's: tuned,
# hf-2023 at twice the steps ended ahead of it (benchmarks/recipes_tuned.py, docs/recipes.md)
RECIPES["roberta-2019-mask-decay-clip"] = {**RECIPES["roberta-2019-mask-decay"], "clip_norm": 1.0}
# Continuing a pre-trained model: the authors' command for domain-adaptive pre-training of roberta-base
# (allenai/dont-stop-pretraining, ADAPTIVE_PRETRAINING.md: 12,500 steps of 16 x 128 accumulated = 2,048 sequences
# at 5e-4), with what its script (their copy of transformers' run_language_modeling.py) leaves at its defaults:
# AdamW betas (0.9, 0.999), epsilon 1e-8, no warmup, linear decay to 0, no weight decay, gradient norm clipped at
# 1.0, 15% masking. Given there for GPUs: the repository sends TPU runs to allenai/tpu-pretrain, not read here.
RECIPES["dapt-2020"] = dict(
    learning_rate=5e-4,
    adam_beta2=0.999,
    adam_epsilon=1e-8,
    clip_norm=1.0,
    warmup_fraction=0.0,
    warmup_steps=0,
    lr_schedule="linear",
    decay_fraction=0.0,
    weight_decay=0.0,
    dropout=MODEL_DROPOUT,
    mlm_probability=0.15,
    final_mlm_probability=0.0,
    batch_warmup_fraction=0.0,
)
DEFAULT_RECIPE = "roberta-2019-mask-decay-clip"  # a run from scratch's
CONTINUED_RECIPE = "dapt-2020"  # a run that continues --init_from's


def default_recipe(init_from: str) -> str:
    """The recipe a run takes when none is named: continuing a model is not starting one."""
    return CONTINUED_RECIPE if init_from else DEFAULT_RECIPE


@dataclass(kw_only=True)
class ShapeKnobs:
    """The recipe, and its knobs that change the run's shape: the masking rates size the LM head (the most
    positions a sample masks), the batch warm-up the samples read. The training's settings and the estimate's."""

    recipe: str = field(
        default="",
        metadata={
            "help": f"The recipe whose values the knobs left at -1 take, one of {sorted(RECIPES)}; empty: "
            f"{DEFAULT_RECIPE} from scratch, {CONTINUED_RECIPE} with init_from. hf-2023 is the 2023 reference "
            "run's, roberta-2019 fairseq's RoBERTa, dapt-2020 Don't Stop Pretraining's (docs/recipes.md).",
            "choices": ("", *RECIPES),
        },
    )
    mlm_probability: float = field(
        default=float(RECIPE_VALUE),
        metadata={"help": "Share of tokens masked in training (at the start); -1: the recipe's."},
    )
    final_mlm_probability: float = field(
        default=float(RECIPE_VALUE),
        metadata={
            "help": "The masking share at the end, reached linearly from mlm_probability; 0: constant; -1: the "
            "recipe's. Validation masks a fixed share (0.15) whatever this is."
        },
    )
    batch_warmup_fraction: float = field(
        default=float(RECIPE_VALUE),
        metadata={
            "help": "Share of the steps over which the global batch grows to its full size: those steps sum fewer "
            "micro-batches (1, 2, 4, ... below gradient_accumulation_steps, an equal share each), at a learning "
            "rate scaled by the square root of their batch over the full one; needs gradient_accumulation_steps "
            "above 1. 0: none; -1: the recipe's."
        },
    )


@dataclass(kw_only=True)
class Recipe(ShapeKnobs):
    """A run's recipe and knobs, declared here once: the training's settings are these fields, and
    ``resolve_recipe`` gives every knob its value (the recipe's for one left at ``RECIPE_VALUE``)."""

    learning_rate: float = field(
        default=float(RECIPE_VALUE), metadata={"help": "Peak learning rate; -1: the recipe's."}
    )
    adam_beta2: float = field(default=float(RECIPE_VALUE), metadata={"help": "Adam's beta2; -1: the recipe's."})
    adam_epsilon: float = field(default=float(RECIPE_VALUE), metadata={"help": "Adam's epsilon; -1: the recipe's."})
    clip_norm: float = field(
        default=float(RECIPE_VALUE),
        metadata={
            "help": "Clip each optimizer step's gradient (summed over micro-batches and replicas) to this global "
            "norm; 0: no clipping; -1: the recipe's."
        },
    )
    warmup_fraction: float = field(
        default=float(RECIPE_VALUE), metadata={"help": "Share of the steps of linear warmup; -1: the recipe's."}
    )
    warmup_steps: int = field(
        default=RECIPE_VALUE,
        metadata={
            "help": "Steps of linear warmup, above 0 instead of warmup_fraction (0: use warmup_fraction, which is "
            "0 for no warmup); -1: the recipe's."
        },
    )
    lr_schedule: str = field(
        default="",
        metadata={
            "help": "linear: warmup then linear decay to 0; wsd: warmup, stable, then linear decay to 0 over the last "
            "decay_fraction of the steps; empty: the recipe's."
        },
    )
    decay_fraction: float = field(
        default=float(RECIPE_VALUE), metadata={"help": "wsd: share of the steps of the final decay; -1: the recipe's."}
    )
    weight_decay: float = field(
        default=float(RECIPE_VALUE), metadata={"help": "Decoupled weight decay rate; -1: the recipe's."}
    )
    dropout: float = field(
        default=float(RECIPE_VALUE),
        metadata={
            "help": "Hidden and attention dropout while pre-training (0: none); the saved model keeps its config's "
            "for fine-tuning. -1: the recipe's, which for every recipe here is the model config's (roberta-base: "
            "0.1)."
        },
    )


KNOBS = tuple(knob.name for knob in fields(Recipe) if knob.name != "recipe")


def resolve_recipe(values: Mapping[str, Any]) -> Recipe:
    """The knobs of a run: those ``values`` gives (settings, or a pipeline's parameters), the ``recipe``'s for
    those left at ``RECIPE_VALUE``; each checked. No ``recipe`` named: the default for ``init_from``'s run."""
    name = values.get("recipe") or default_recipe(values.get("init_from", ""))
    if name not in RECIPES:
        raise InvalidParameter("recipe", name, f"must be one of {sorted(RECIPES)}")
    given = {knob: values.get(knob, RECIPE_VALUE) for knob in KNOBS}
    given = {knob: value for knob, value in given.items() if value not in (RECIPE_VALUE, "")}
    for knob, value in given.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidParameter(knob, value, "must be a finite number")
    # what a given knob means for another the recipe would set (resolving twice gives the same knobs)
    if given.get("warmup_steps", 0) > 0:
        if given.get("warmup_fraction", 0) > 0:
            raise InvalidParameter("warmup_steps", given["warmup_steps"], "give it or warmup_fraction, not both")
        given["warmup_fraction"] = 0.0
    if given.get("lr_schedule") == "linear":
        if given.get("decay_fraction", 0) > 0:
            raise InvalidParameter(
                "decay_fraction", given["decay_fraction"], "is for lr_schedule wsd; linear decays over the whole run"
            )
        given["decay_fraction"] = 0.0
    recipe = Recipe(recipe=name, **{**RECIPES[name], **given})
    check_knobs(recipe)
    return recipe


def apply_recipe(settings: Any) -> None:
    """Sets each knob of ``settings`` left at ``RECIPE_VALUE`` to its recipe's value, and the recipe left empty to
    the run's default."""
    resolved = resolve_recipe(vars(settings))
    for knob in ("recipe", *KNOBS):
        setattr(settings, knob, getattr(resolved, knob))


def check_knobs(settings: Any) -> None:
    if not (settings.learning_rate > 0 and math.isfinite(settings.learning_rate)):
        raise InvalidParameter("learning_rate", settings.learning_rate, "must be a positive number (1e-4 is usual)")
    if not 0 <= settings.adam_beta2 < 1:
        raise InvalidParameter("adam_beta2", settings.adam_beta2, "must be at least 0 and below 1 (0.98 or 0.999)")
    if not 0 < settings.adam_epsilon < 1:
        raise InvalidParameter("adam_epsilon", settings.adam_epsilon, "must be above 0 and below 1 (1e-6 or 1e-8)")
    if settings.clip_norm < 0:
        raise InvalidParameter("clip_norm", settings.clip_norm, "must be 0 (no clipping) or positive (1.0 is usual)")
    if not 0.0 <= settings.warmup_fraction < 1.0:
        raise InvalidParameter("warmup_fraction", settings.warmup_fraction, "must be at least 0 and below 1")
    if settings.warmup_steps < 0:
        raise InvalidParameter("warmup_steps", settings.warmup_steps, "must be 0 (use warmup_fraction) or positive")
    if settings.lr_schedule not in SCHEDULES:
        raise InvalidParameter("lr_schedule", settings.lr_schedule, f"must be one of {SCHEDULES}")
    if settings.lr_schedule == "linear" and settings.decay_fraction:
        raise InvalidParameter(
            "decay_fraction", settings.decay_fraction, "is for lr_schedule wsd; linear decays over the whole run"
        )
    if settings.lr_schedule == "wsd" and not 0 < settings.decay_fraction <= 1:
        raise InvalidParameter(
            "decay_fraction",
            settings.decay_fraction,
            "must be above 0 and at most 1 with lr_schedule wsd (0.2 is usual)",
        )
    if settings.weight_decay < 0:
        raise InvalidParameter("weight_decay", settings.weight_decay, "must be 0 or positive")
    if settings.dropout != MODEL_DROPOUT and not 0 <= settings.dropout < 1:
        raise InvalidParameter(
            "dropout", settings.dropout, "must be -1 (the model config's), or at least 0 and below 1"
        )
    if not 0 <= settings.batch_warmup_fraction < 1:
        raise InvalidParameter(
            "batch_warmup_fraction", settings.batch_warmup_fraction, "must be at least 0 (none) and below 1"
        )
    check_probability(settings.mlm_probability)
    if settings.final_mlm_probability:
        check_probability(settings.final_mlm_probability, "final_mlm_probability")


def highest_mlm_probability(settings: Any) -> float:
    """The highest share of tokens the training masks, which sizes the LM head's predictions."""
    return max(settings.mlm_probability, settings.final_mlm_probability)


def warmup_steps(settings: Any, total_steps: int) -> int:
    return settings.warmup_steps or int(settings.warmup_fraction * total_steps)


def learning_rate_schedule(
    settings: Any, total_steps: int, batch_scales: tuple[tuple[int, float], ...] = ((0, 1.0),)
) -> Any:
    """The learning rate at an optimizer step: linear warmup from 0 to the peak, then a linear decay to 0 over the
    rest of the run (``linear``: the reference's, as ``transformers.create_optimizer`` makes it), or a stable
    phase at the peak and a linear decay to 0 over the last ``decay_fraction`` of the steps (``wsd``: a run can
    be extended or cut in its stable phase without training again). ``batch_scales``: (first step, factor) of
    each stage of the batch warm-up (``RunShape.learning_rate_scales``), the factor multiplying the rate there."""
    import tensorflow as tf
    from transformers.modeling_tf_utils import keras

    peak = settings.learning_rate
    warmup = min(warmup_steps(settings, total_steps), total_steps)
    decay_start = warmup
    if settings.lr_schedule == "wsd":
        decay_start = max(warmup, total_steps - round(settings.decay_fraction * total_steps))
    decay_steps = max(total_steps - decay_start, 1)

    class Schedule(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step: Any) -> Any:
            step = tf.cast(step, tf.float32)
            warming = peak * (step / max(warmup, 1))
            decaying = peak * (1 - tf.minimum(step - decay_start, decay_steps) / decay_steps)
            rate = tf.where(step < warmup, warming, tf.where(step < decay_start, peak, decaying))
            scale = tf.constant(1.0, tf.float32)
            for first_step, factor in batch_scales:
                scale = tf.where(step >= first_step, tf.constant(factor, tf.float32), scale)
            return rate * scale

        def get_config(self) -> dict[str, Any]:
            return {
                "peak": peak,
                "warmup": warmup,
                "decay_start": decay_start,
                "total_steps": total_steps,
                "batch_scales": batch_scales,
            }

    return Schedule()


def create_optimizer(
    settings: Any, total_steps: int, batch_scales: tuple[tuple[int, float], ...] = ((0, 1.0),)
) -> tuple[Any, Any]:
    """(optimizer, schedule): AdamWeightDecay (beta1 0.9) with the recipe's beta2, epsilon and weight decay,
    LayerNorm and biases excluded from decay, as ``transformers.create_optimizer`` makes it. Clipping is the
    training step's (``train_function``): it must see the gradient summed over micro-batches and replicas."""
    from transformers import AdamWeightDecay

    schedule = learning_rate_schedule(settings, total_steps, batch_scales)
    optimizer = AdamWeightDecay(
        learning_rate=schedule,
        weight_decay_rate=settings.weight_decay,
        beta_1=0.9,
        beta_2=settings.adam_beta2,
        epsilon=settings.adam_epsilon,
        exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"],
    )
    return optimizer, schedule
