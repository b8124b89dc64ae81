"""``tpu_catalogue``: the recipe's batch on each TPU type, its prices, start deadline and command, the TPU job's env."""

import pytest

from components.lib.errors import InvalidParameter
from components.lib.recipe import RECIPE_GLOBAL_BATCH
from components.lib.tpu_catalogue import (
    SLICE_HOSTS_MINUTES,
    TPU_MICRO_BATCH,
    TPU_RUNTIME_ENV,
    TPU_START_MINUTES,
    TPU_TYPES,
    BatchSettings,
    default_batch,
    tpu_runtime_env,
    tpu_type,
)
from components.slice import launched


@pytest.mark.parametrize("tpu", TPU_TYPES.values(), ids=TPU_TYPES.keys())
def test_every_tpu_type_trains_at_the_recipe_s_global_batch_in_micro_batches_that_fit(tpu):
    batch = default_batch(tpu.replicas)
    micro_batch, accumulation = batch["per_replica_batch_size"], batch["gradient_accumulation_steps"]
    assert micro_batch * tpu.replicas * accumulation == RECIPE_GLOBAL_BATCH
    assert micro_batch <= TPU_MICRO_BATCH
    assert accumulation == 1 or micro_batch == TPU_MICRO_BATCH  # accumulating only micro-batches as large as fit


def test_a_batch_left_at_0_takes_the_accelerator_s_default_for_each_value_on_its_own():
    def resolved(tpu: str | None, **given: int) -> tuple[int, int]:
        batch = BatchSettings(**given)
        batch.resolve_batch(TPU_TYPES[tpu].replicas if tpu else None)
        return batch.per_replica_batch_size, batch.gradient_accumulation_steps

    assert resolved("v3-8") == (128, 2) and resolved("v5e-1") == (128, 16) and resolved("v5e-32") == (64, 1)
    # the TPU's accumulation kept whatever the micro-batch (a small one is not unrolled into dozens a step)
    assert resolved("v3-8", per_replica_batch_size=64) == (64, 2) and resolved("v5e-1", per_replica_batch_size=8) == (
        8,
        16,
    )
    assert resolved("v5e-1", gradient_accumulation_steps=4) == (128, 4)
    assert resolved(None) == (8, 1) and resolved(None, per_replica_batch_size=16) == (16, 1)
    with pytest.raises(InvalidParameter, match=r"--gradient-accumulation-steps=-1: must be 0 \(the accelerator's"):
        resolved("v3-8", gradient_accumulation_steps=-1)


def test_a_tpu_type_is_looked_up_by_name_and_an_unknown_one_refused_with_the_known():
    assert tpu_type("v5e-4") is TPU_TYPES["v5e-4"]
    with pytest.raises(InvalidParameter, match=r"--tpu-type='v4-8': must be one of \['v3-8', 'v5e-1'"):
        tpu_type("v4-8")


def test_spot_is_priced_at_the_spot_list_price_and_any_other_provisioning_on_demand():
    v3 = TPU_TYPES["v3-8"]
    assert v3.list_price("SPOT") == v3.spot_list_price_per_hour < v3.list_price("STANDARD") == v3.list_price_per_hour


def test_a_slice_runs_its_command_under_the_launcher_and_has_longer_to_start():
    command = ["python", "-m", "components.train", "--max_steps", "10"]
    one_host, slice_of_hosts = TPU_TYPES["v5e-8"], TPU_TYPES["v5e-16"]
    assert launched(one_host, command, "gs://bucket/reports") == command
    assert one_host.start_deadline_minutes == TPU_START_MINUTES
    launcher = ["python", "-m", "components.slice", "--tpu_type", "v5e-16"]
    assert launched(slice_of_hosts, command) == [*launcher, "--", *command]
    assert launched(slice_of_hosts, command, "gs://r") == [*launcher, "--report_dir", "gs://r", "--", *command]
    assert slice_of_hosts.start_deadline_minutes == TPU_START_MINUTES + SLICE_HOSTS_MINUTES  # the hosts come first


def test_the_tpu_job_s_environment_is_the_defaults_with_changes_and_drops():
    changed, dropped = sorted(TPU_RUNTIME_ENV)[:2]
    env = tpu_runtime_env([f"{changed}=new", "TF_CPP_MIN_LOG_LEVEL=0", f"{dropped}="])
    expected = {**TPU_RUNTIME_ENV, changed: "new", "TF_CPP_MIN_LOG_LEVEL": "0"}
    del expected[dropped]
    assert env == expected
    assert tpu_runtime_env([]) == TPU_RUNTIME_ENV and tpu_runtime_env([]) is not TPU_RUNTIME_ENV
    for bad in ("NO_EQUALS", "1ST=x", "=x", "A-B=x"):
        with pytest.raises(InvalidParameter, match=rf"--smoke-env='{bad}': must be KEY=VALUE \(KEY= drops a default\)"):
            tpu_runtime_env([bad], parameter="smoke_env")
