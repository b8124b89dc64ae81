"""Whether a model and batch fit one training replica's memory: an estimate meant to catch a run that cannot fit
before a TPU is paid for, not to replace XLA's own accounting, which only a real TPU gives. Preflight, the
estimate, submit and the smoke test read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory of one training replica, in bytes, as a range: activations with the attention scores
    recomputed (``low``) and kept (``high``), and how it compares with the accelerator's memory."""

    parameters: int  # fp32 weights, gradients and Adam's two moments
    per_sample_low: int
    per_sample_high: int
    batch: int
    available: int | None

    FITS = 0.8  # above this share of the memory a run is tight: XLA needs room for buffers and fusions

    @property
    def low(self) -> int:
        return self.parameters + self.per_sample_low * self.batch

    @property
    def high(self) -> int:
        return self.parameters + self.per_sample_high * self.batch

    @property
    def low_gib(self) -> float:
        return round(self.low / GIB, 2)

    @property
    def high_gib(self) -> float:
        return round(self.high / GIB, 2)

    @property
    def verdict(self) -> str:
        """ "does not fit" when even the low estimate exceeds the memory, "tight" when the high one is above
        80% of it, else "fits"."""
        if self.available is None:
            return "unknown"
        if self.low > self.available:
            return "does not fit"
        return "tight" if self.high > self.FITS * self.available else "fits"

    @property
    def largest_batch(self) -> int | None:
        """The largest per-replica batch whose high estimate stays within 80% of the memory, a multiple of 8
        (the TPU's matrix tiles) when it can be."""
        if self.available is None:
            return None
        batch = max(0, math.floor((self.FITS * self.available - self.parameters) / self.per_sample_high))
        return batch - batch % 8 if batch >= 8 else batch

    def refusal(self, tpu_name: str, bf16: bool, allow_tight: bool) -> str | None:
        """Why a run at this batch is refused before the TPU is taken (preflight, submit), or None: it cannot
        fit, or it is tight and the user did not opt in; an out-of-memory at XLA compile comes only after the
        TPU was provisioned and every step before it paid."""
        if self.verdict == "does not fit":
            advice = f"a per-replica batch of {self.largest_batch} fits"
            if not bf16:
                advice += ", and --bf16 true halves the activations"
            return (
                f"needs at least {self.low / GIB:.1f} GiB per replica ({self.parameters / GIB:.1f} GiB weights and "
                f"optimizer state, the rest activations), more than a {tpu_name} replica's "
                f"{self.available / GIB:.0f} GiB; {advice}"
            )
        if self.verdict == "tight" and not allow_tight:
            return (
                f"may not fit: {self.low / GIB:.1f}-{self.high / GIB:.1f} GiB per replica of a {tpu_name}'s "
                f"{self.available / GIB:.0f} GiB; use {self.largest_batch} or less (raise gradient_accumulation_steps "
                "to keep the global batch), or allow_tight_memory=true to try it"
            )
        return None

    def describe(self) -> str:
        line = f"{self.low / GIB:.1f}-{self.high / GIB:.1f} GiB per replica ({self.parameters / GIB:.1f} GiB "
        line += f"weights and optimizer state, the rest activations of {self.batch} samples)"
        if self.available is not None:
            line += f" of {self.available / GIB:.0f} GiB: {self.verdict}"
        return line


def training_memory(
    config: Any,
    num_parameters: int,
    per_replica_batch_size: int,
    max_length: int,
    bf16: bool,
    predictions: int,
    available_gib: float | None = None,
    accumulation: int = 1,
) -> MemoryEstimate:
    """Memory of one replica training an encoder: 16 bytes a parameter (fp32 weights and gradients, Adam's m
    and v; mixed precision keeps fp32 variables), and the activations kept for the backward pass, after
    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"): per sample and
    layer ``34*s*h`` bytes at 2-byte precision with the attention scores recomputed (their eq. 2, the low
    estimate) and ``s*h*(34 + 5*a*s/h)`` with them kept (eq. 1, the high one), twice that in fp32; plus the LM
    head's fp32 logits and their gradient at the masked positions. Without XLA's fusions, which only a TPU
    shows. Accumulating micro-batches adds the gradients' running sum: 4 bytes a parameter."""
    s, h, a = max_length, config.hidden_size, config.num_attention_heads
    scale = 1 if bf16 else 2
    head = predictions * config.vocab_size * 4 * 2 + s * h * 2 * scale
    low = config.num_hidden_layers * 34 * s * h * scale + head
    high = low + config.num_hidden_layers * 5 * a * s * s * scale
    return MemoryEstimate(
        parameters=(16 + 4 * (accumulation > 1)) * num_parameters,
        per_sample_low=low,
        per_sample_high=high,
        batch=per_replica_batch_size,
        available=None if available_gib is None else int(available_gib * GIB),
    )
