"""``memory_model``: one training replica's memory, its verdict against the accelerator's and the refusal it makes."""

from dataclasses import replace
from types import SimpleNamespace

from components.lib.memory_model import GIB, MemoryEstimate, training_memory
from components.lib.modeling import PRESETS, count_parameters
from components.lib.tpu_catalogue import TPU_TYPES

# the fields of roberta-base's config with a 25,000-piece vocabulary that the arithmetic reads
ROBERTA_BASE = SimpleNamespace(**PRESETS["roberta-base"], vocab_size=25_000)
PARAMETERS = count_parameters(ROBERTA_BASE)
V3_CORE_GIB = TPU_TYPES["v3-8"].memory_gib_per_replica


def estimate(batch: int, bf16: bool, accumulation: int = 1) -> MemoryEstimate:
    return training_memory(ROBERTA_BASE, PARAMETERS, batch, 128, bf16, 45, V3_CORE_GIB, accumulation)


def test_memory_estimate_of_roberta_base_on_a_v3_core():
    fp32, bf16 = estimate(256, bf16=False), estimate(256, bf16=True)
    assert fp32.parameters == bf16.parameters == 16 * PARAMETERS  # fp32 weights, grads, m and v
    # 34 bytes per token, hidden unit and layer in bf16 (Korthikanti et al. eq. 2), the head's fp32 logits and
    # their gradient at 45 masked positions; eq. 1 adds the attention scores, 5 x heads x length per token
    assert bf16.per_sample_low == 12 * 34 * 128 * 768 + 45 * 25_000 * 8 + 128 * 768 * 2
    assert bf16.per_sample_high - bf16.per_sample_low == 12 * 5 * 12 * 128 * 128
    assert fp32.per_sample_high - fp32.per_sample_low == 2 * (bf16.per_sample_high - bf16.per_sample_low)
    assert fp32.verdict == "does not fit"  # what the pipeline's old default of bf16=false asked of a v3 core
    assert bf16.verdict == "tight"  # the reference recipe's setting: refused by preflight unless allowed
    largest = fp32.largest_batch
    assert largest % 8 == 0 and estimate(largest, bf16=False).verdict == "fits"
    assert estimate(largest + 8, bf16=False).verdict != "fits"


def test_accumulating_micro_batches_adds_their_gradients_sum_and_no_activations():
    once, accumulated = estimate(128, bf16=True), estimate(128, bf16=True, accumulation=4)
    assert accumulated.parameters - once.parameters == 4 * PARAMETERS  # an fp32 running sum of the gradients
    assert (accumulated.per_sample_low, accumulated.per_sample_high) == (once.per_sample_low, once.per_sample_high)


def test_below_eight_samples_the_largest_batch_is_not_rounded_to_the_tiles():
    # a GiB a sample and 7 GiB of memory: 80% of it holds 5 samples
    memory = MemoryEstimate(parameters=0, per_sample_low=GIB // 2, per_sample_high=GIB, batch=6, available=7 * GIB)
    assert memory.largest_batch == int(MemoryEstimate.FITS * 7)
    assert replace(memory, batch=memory.largest_batch).verdict == "fits" and memory.verdict == "tight"


def test_a_run_that_cannot_fit_or_is_tight_is_refused_with_a_batch_that_fits():
    fp32 = estimate(256, bf16=False)
    refusal = fp32.refusal("v3-8", bf16=False, allow_tight=True)  # allowing a tight run does not allow this one
    assert refusal.startswith(f"needs at least {fp32.low / GIB:.1f} GiB per replica")
    assert f"a per-replica batch of {fp32.largest_batch} fits, and --bf16 true halves the activations" in refusal
    assert "--bf16" not in estimate(10_000, bf16=True).refusal("v3-8", bf16=True, allow_tight=False)

    tight = estimate(256, bf16=True)
    refusal = tight.refusal("v3-8", bf16=True, allow_tight=False)
    assert (
        f"may not fit: {tight.low / GIB:.1f}-{tight.high / GIB:.1f} GiB per replica of a v3-8's {V3_CORE_GIB:.0f} GiB"
        in refusal
    )
    assert f"use {tight.largest_batch} or less" in refusal and "allow_tight_memory=true" in refusal
    assert tight.refusal("v3-8", bf16=True, allow_tight=True) is None
    assert estimate(tight.largest_batch, bf16=True).refusal("v3-8", bf16=True, allow_tight=False) is None


def test_without_the_accelerator_s_memory_nothing_is_judged():
    unknown = replace(estimate(256, bf16=False), available=None)
    assert unknown.verdict == "unknown" and unknown.largest_batch is None
    assert unknown.refusal("a CPU", bf16=False, allow_tight=False) is None
    assert unknown.describe().endswith("the rest activations of 256 samples)")  # no "of N GiB: verdict"
    assert estimate(256, bf16=True).describe().endswith(f"of {V3_CORE_GIB:.0f} GiB: tight")
