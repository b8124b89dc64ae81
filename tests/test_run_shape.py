"""``run_shape``: a run's batch, steps, tokens, model FLOPs, memory, hours and cost from its settings alone."""

from types import SimpleNamespace

import pytest

from components.lib.errors import InvalidParameter
from components.lib.masked_lm import max_predictions
from components.lib.memory_model import training_memory
from components.lib.modeling import PRESETS, count_parameters, training_flops_per_token
from components.lib.run_shape import DEFAULT_MFU, run_shape
from components.lib.tpu_catalogue import TPU_TYPES

# the fields of a model config the arithmetic reads, without importing transformers for a RobertaConfig
TINY = SimpleNamespace(**PRESETS["tiny"], vocab_size=3000)


def test_the_global_batch_is_per_replica_times_replicas_times_accumulation_and_an_epoch_drops_its_remainder():
    per_replica, replicas, accumulation, samples = 16, 4, 3, 10_000
    shape = run_shape(
        per_replica_batch_size=per_replica,
        accumulation=accumulation,
        max_length=128,
        samples=samples,
        num_epochs=2,
        replicas=replicas,
    )
    global_batch = per_replica * replicas * accumulation
    assert shape.global_batch_size == global_batch and shape.micro_batch_size == per_replica * replicas
    assert shape.steps == 2 * (samples // global_batch)
    assert shape.samples == shape.steps * global_batch < 2 * samples  # the remainder fills no global batch
    assert shape.tokens_per_step == global_batch * 128 and shape.tokens == shape.steps * global_batch * 128
    assert shape.hours is None and shape.cost is None  # no model, no accelerator's peak


def test_max_steps_wins_over_epochs_and_needs_no_sample_count():
    common = {"per_replica_batch_size": 8, "accumulation": 1, "max_length": 64, "replicas": 2, "max_steps": 7}
    assert run_shape(**common, samples=1000, num_epochs=5).steps == 7
    assert run_shape(**common, samples=None).samples == 7 * 8 * 2
    with pytest.raises(ValueError, match="needs the training samples or max_steps"):
        run_shape(**{**common, "max_steps": 0}, samples=None)
    with pytest.raises(ValueError, match="needs a TPU type or a positive replica count"):
        run_shape(**{**common, "replicas": 0}, samples=1000)


def test_a_global_batch_larger_than_the_data_is_refused_naming_its_factors():
    common = {"per_replica_batch_size": 10, "max_length": 128, "replicas": 4}
    assert run_shape(**common, accumulation=1, samples=40).steps == 1  # one global batch exactly
    with pytest.raises(InvalidParameter, match=r"--per-replica-batch-size=10: x 4 replica\(s\) = global batch 40, "):
        run_shape(**common, accumulation=1, samples=39)
    with pytest.raises(InvalidParameter, match=r"x 4 replica\(s\) x 2 micro-batches = global batch 80, more than"):
        run_shape(**common, accumulation=2, samples=79)


def test_a_batch_warm_up_doubles_the_micro_batches_over_equal_shares_and_reads_fewer_samples():
    # 100 steps of 8 micro-batches of 2 x 4 samples, a quarter of them warming up: 1, 2, 4 micro-batches a step
    common = {"per_replica_batch_size": 4, "accumulation": 8, "max_length": 32, "replicas": 2, "max_steps": 100}
    shape = run_shape(**common, samples=None, batch_warmup_fraction=0.25)
    assert shape.batch_stages == ((0, 1), (8, 2), (17, 4), (25, 8))  # 25 steps in thirds, rounded
    assert [shape.accumulation_at(step) for step in (0, 7, 8, 16, 17, 24, 25, 99)] == [1, 1, 2, 2, 4, 4, 8, 8]
    assert [shape.next_stage_start(step) for step in (0, 8, 20, 25, 99)] == [8, 17, 25, 100, 100]
    per_step = [shape.accumulation_at(step) for step in range(100)]
    assert [shape.micro_batches_before(step) for step in (0, 10, 100)] == [0, sum(per_step[:10]), sum(per_step)]
    assert shape.samples == sum(per_step) * 8 == (8 * 1 + 9 * 2 + 8 * 4 + 75 * 8) * 8
    assert shape.tokens == shape.samples * 32 and shape.global_batch_size == 64  # the full batch stays the setting
    # the learning rate at a stage's batch: the square root of its share of the full batch
    starts, scales = zip(*shape.learning_rate_scales, strict=True)
    assert starts == (0, 8, 17, 25) and scales == pytest.approx((8**-0.5, 0.5, 0.5**0.5, 1.0))
    # none: one stage at the full batch
    assert run_shape(**common, samples=None).batch_stages == ((0, 8),)
    # an accumulation that is no power of two ends the ramp below it: 1, 2, then 3
    odd = run_shape(**{**common, "accumulation": 3}, samples=None, batch_warmup_fraction=0.2)
    assert odd.batch_stages == ((0, 1), (10, 2), (20, 3))


def test_a_batch_warm_up_with_one_micro_batch_a_step_is_refused_saying_what_to_change():
    common = {"per_replica_batch_size": 8, "max_length": 64, "replicas": 1, "max_steps": 10, "samples": None}
    with pytest.raises(InvalidParameter, match=r"--batch-warmup-fraction=0\.1: grows the batch by summing more micro-"):
        run_shape(**common, accumulation=1, batch_warmup_fraction=0.1)
    assert len(run_shape(**common, accumulation=2, batch_warmup_fraction=0.1).batch_stages) == 2


def test_a_tpu_gives_its_replicas_peak_memory_and_list_price():
    tpu = TPU_TYPES["v5e-8"]
    shape = run_shape(
        per_replica_batch_size=32, accumulation=2, max_length=128, samples=None, max_steps=100, tpu=tpu, config=TINY
    )
    assert shape.replicas == tpu.replicas and shape.global_batch_size == 32 * tpu.replicas * 2
    assert shape.peak_flops_per_second == tpu.replicas * tpu.peak_tflops_per_replica * 1e12
    assert shape.price_per_hour == tpu.list_price_per_hour
    assert shape.memory == training_memory(
        TINY, shape.parameters, 32, 128, True, max_predictions(128, 0.15), tpu.memory_gib_per_replica, 2
    )
    one_step = {"per_replica_batch_size": 8, "accumulation": 1, "max_length": 128, "samples": None, "max_steps": 1}
    assert run_shape(**one_step, tpu=tpu, price_per_hour=3.0).price_per_hour == 3.0  # a price given wins
    assert run_shape(**one_step, tpu=tpu, replicas=tpu.replicas).replicas == tpu.replicas
    with pytest.raises(InvalidParameter, match=r"--replicas=4: a v5e-8 has 8 replicas"):
        run_shape(**one_step, tpu=tpu, replicas=4)


def test_the_model_s_flops_give_the_hours_at_the_assumed_mfu_and_the_cost_at_the_price():
    tpu = TPU_TYPES["v3-8"]
    run = {"per_replica_batch_size": 16, "accumulation": 1, "max_length": 128, "samples": 50_000, "config": TINY}
    shape = run_shape(**run, tpu=tpu)
    assert shape.parameters == count_parameters(TINY)
    assert shape.flops_per_token == training_flops_per_token(TINY, shape.parameters, 128)
    assert shape.model_flops_per_step == shape.flops_per_token * shape.global_batch_size * 128
    assert shape.model_flops == shape.model_flops_per_step * shape.steps
    peak = tpu.replicas * tpu.peak_tflops_per_replica * 1e12
    assert shape.mfu == DEFAULT_MFU
    assert shape.hours == pytest.approx(shape.model_flops / (DEFAULT_MFU * peak) / 3600)
    assert shape.cost == pytest.approx(shape.hours * tpu.list_price_per_hour)
    # at a measured rate instead of the assumed one: a run twice as fast costs half
    assert shape.cost_at(5.0, 2 * DEFAULT_MFU * peak) == pytest.approx(shape.hours / 2 * 5.0)
    assert run_shape(**run, tpu=tpu, mfu=DEFAULT_MFU / 2).hours == pytest.approx(2 * shape.hours)
    on_replicas = run_shape(**run, replicas=8)
    assert on_replicas.hours is None and on_replicas.cost is None  # no accelerator named: its peak is unknown
    assert on_replicas.memory.available is None
