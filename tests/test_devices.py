"""``devices``: TPU chips found by their PCI ids, the TPU runtime kept out where no TPU is used, strategies, peaks."""

import logging
import os
import re
from pathlib import Path

import pytest

from components.lib import devices
from components.lib.devices import (
    NO_TPU_DEVICE,
    AcceleratorStartFailed,
    peak_tflops_per_replica,
    prepare_runtime,
    select_strategy,
    slice_or,
    tpu_devices,
    tpu_start_failed,
)
from components.lib.errors import InvalidParameter, StartFailed
from components.lib.job_runner import BAD_INPUT_EXIT, one_line_failure
from components.lib.slice_hosts import ENDPOINTS_VARIABLE
from components.lib.tpu_catalogue import TPU_RUNTIME_VARIABLES, TPU_TYPES

A_CHIP = "/sys/bus/pci/devices/0000:00:04.0"
SLICE_ENDPOINTS = "grpc://10.0.0.2:8470,grpc://10.0.0.3:8470"


def image_runtime(monkeypatch) -> None:
    """The TPU image's environment, pointing TensorFlow at libtpu; the test's changes undone after it."""
    for name in TPU_RUNTIME_VARIABLES:
        monkeypatch.setenv(name, "set by the TPU image")
    monkeypatch.delenv("TPU_LOAD_LIBRARY", raising=False)


def runtime_kept() -> bool:
    return "TPU_LOAD_LIBRARY" not in os.environ and all(name in os.environ for name in TPU_RUNTIME_VARIABLES)


def runtime_skipped() -> bool:
    return os.environ.get("TPU_LOAD_LIBRARY") == "0" and not any(name in os.environ for name in TPU_RUNTIME_VARIABLES)


def test_strategy_selection(caplog, monkeypatch):
    image_runtime(monkeypatch)
    caplog.set_level(logging.INFO)
    strategy, kind = select_strategy("auto")
    assert kind == "cpu" and strategy.num_replicas_in_sync == 1
    assert "accelerator auto: no TPU and no GPU found; training on the CPU" in caplog.text
    assert select_strategy("cpu")[1] == "cpu"
    with pytest.raises(InvalidParameter, match=r"--accelerator='tpu': no TPU found at --tpu='local'"):
        select_strategy("tpu")
    with pytest.raises(InvalidParameter, match=r"--accelerator='gpu': no GPU is visible"):
        select_strategy("gpu")
    # off a TPU VM (no TPU device files), neither auto nor cpu loads the TPU runtime, which would wait minutes
    assert "this machine has no TPU device" in caplog.text and runtime_skipped()


def test_tpu_chips_are_counted_by_google_s_pci_vendor_and_a_tpu_device_id(tmp_path):
    def pci_device(slot: str, vendor: str, device: str) -> Path:
        folder = tmp_path / "sys/bus/pci/devices" / slot
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
        return folder

    assert tpu_devices(str(tmp_path)) == []
    pci_device("0000:00:03.0", "0x8086", "0x0027")  # another vendor's device with a TPU's id: not a TPU
    pci_device("0000:00:05.0", "0x1ae0", "0x0042")  # gVNIC, the network card of most GCE VMs: Google's, not a TPU
    (tmp_path / "dev/vfio").mkdir(parents=True)
    (tmp_path / "dev/vfio/0").write_text("")  # a VFIO group (of any device) is not a TPU where the bus is visible
    assert tpu_devices(str(tmp_path)) == []
    chips = [pci_device(f"0000:00:0{slot}.0", "0x1ae0", "0x0063") for slot in (6, 7, 8, 9)]  # a v5e-4 VM
    assert tpu_devices(str(tmp_path)) == [str(chip) for chip in chips]  # four chips, each counted once

    hidden = tmp_path / "container"  # a container that does not show the PCI bus: the device files libtpu opens
    (hidden / "dev").mkdir(parents=True)
    (hidden / "dev/accel0").write_text("")
    (hidden / "dev/accel1").write_text("")
    assert tpu_devices(str(hidden)) == [str(hidden / "dev/accel0"), str(hidden / "dev/accel1")]
    assert "/dev/accel*" in NO_TPU_DEVICE and "/dev/vfio/N" in NO_TPU_DEVICE and "0x1ae0" in NO_TPU_DEVICE


def test_off_a_tpu_vm_the_tpu_runtime_is_skipped_and_a_tpu_asked_for_is_refused_in_seconds(monkeypatch):
    monkeypatch.setattr(devices, "tpu_devices", lambda: [])
    image_runtime(monkeypatch)
    prepare_runtime("auto")  # auto falls back without a wait for libtpu
    assert runtime_skipped()
    image_runtime(monkeypatch)
    refusal = f"--accelerator='tpu': no TPU found at --tpu='local' ({NO_TPU_DEVICE})"
    with pytest.raises(InvalidParameter, match=re.escape(refusal)):
        prepare_runtime("tpu")
    assert runtime_skipped()  # what follows the error (a report, say) may still use TensorFlow


@pytest.mark.parametrize(("accelerator", "kept"), [("auto", True), ("tpu", True), ("cpu", False), ("gpu", False)])
def test_on_a_tpu_vm_the_tpu_runtime_is_kept_only_for_a_run_that_may_use_the_tpu(monkeypatch, accelerator, kept):
    monkeypatch.setattr(devices, "tpu_devices", lambda: [A_CHIP])
    image_runtime(monkeypatch)
    prepare_runtime(accelerator)
    assert runtime_kept() if kept else runtime_skipped()


def test_host_zero_of_a_slice_reaches_the_hosts_servers_by_grpc_without_libtpu_or_chips_of_its_own(monkeypatch):
    monkeypatch.setattr(devices, "tpu_devices", lambda: [])
    assert slice_or("local") == "local"
    monkeypatch.setenv(ENDPOINTS_VARIABLE, SLICE_ENDPOINTS)  # what the slice launcher gives host 0's program
    assert slice_or("local") == SLICE_ENDPOINTS and slice_or("my-tpu") == "my-tpu"
    image_runtime(monkeypatch)
    prepare_runtime("tpu")  # no refusal: the chips are the hosts' servers'
    assert runtime_skipped()


def test_the_peak_comes_from_the_pipeline_else_from_the_tpu_vm_s_accelerator_type(monkeypatch):
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v3-8")
    assert peak_tflops_per_replica("tpu", 100.0) == 100.0  # the TPU type's, passed in at compile time
    assert peak_tflops_per_replica("tpu") == TPU_TYPES["v3-8"].peak_tflops_per_replica
    for name in ("v5litepod-4", "V5E-8"):
        monkeypatch.setenv("TPU_ACCELERATOR_TYPE", name)
        assert peak_tflops_per_replica("tpu") == TPU_TYPES["v5e-1"].peak_tflops_per_replica
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v6e-8")  # a TPU the catalogue does not list: no MFU, not a wrong one
    assert peak_tflops_per_replica("tpu") is None
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE")
    assert peak_tflops_per_replica("tpu") is None and peak_tflops_per_replica("cpu") is None


def test_a_tpu_its_runtime_cannot_drive_is_one_line_naming_the_pair_and_the_other_image(monkeypatch):
    import tensorflow as tf

    no_kernel = tf.errors.InvalidArgumentError(
        None,
        None,
        "No OpKernel was registered to support Op 'ConfigureDistributedTPU' used by {{node ConfigureDistributedTPU}}"
        ' with these attrs: [embedding_config="", is_global_init=false]\nRegistered devices: [CPU]\n\t [[{{node '
        "ConfigureDistributedTPU}}]] [Op:__inference__tpu_init_fn_4]",
    )
    line = f"error: {tpu_start_failed(no_kernel, 'local', 'tensorflow-tpu 2.19.1 + libtpu 0.0.10')}"
    assert "\n" not in line and "[[" not in line
    assert line.startswith(
        "error: --accelerator='tpu': TensorFlow could not initialise the TPU at --tpu='local' with tensorflow-tpu "
        "2.19.1 + libtpu 0.0.10 (InvalidArgumentError: No OpKernel was registered to support Op "
        "'ConfigureDistributedTPU'"
    )
    assert line.endswith(
        "this pair cannot drive this TPU, and a new job with this image would fail the same way: try the other TPU "
        "image, tf2.20 (make tpu-image TPU_RUNTIME=tf2.20, push it, then tpu-mlm compile ... --tpu_image <its URI>)"
    )
    # TensorFlow 2.20 wraps the initialisation's InvalidArgumentError in a NotFoundError: the signature still decides
    wrapped = tf.errors.NotFoundError(
        None, None, f"TPUs not found in the cluster. Failed in initialization: {no_kernel.message}"
    )
    line = str(tpu_start_failed(wrapped, "local", "tensorflow-tpu 2.20.0 + libtpu 0.0.14"))
    assert "with tensorflow-tpu 2.20.0 + libtpu 0.0.14 (NotFoundError: TPUs not found in the cluster." in line
    assert "try the other TPU image, tf2.19 (make tpu-image TPU_RUNTIME=tf2.19," in line
    # no TPU system device: also what libtpu held by another process gives (jax-ml/jax#10192), a failed start only
    no_device = tf.errors.NotFoundError(
        None,
        None,
        "TPUs not found in the cluster. Failed in initialization: No matching devices found for "
        "'/device:TPU_SYSTEM:0' [Op:__inference__tpu_init_fn_10]",
    )
    assert isinstance(tpu_start_failed(no_device, "local", "tensorflow-tpu 2.20.0 + libtpu 0.0.14"), StartFailed)
    other_binary = tf.errors.NotFoundError(
        None,
        None,
        "'__inference__tpu_init_fn_4' is neither a type of a primitive operation nor a name of a function registered "
        "in binary running on n-3ea5ef93-w-0. Make sure the operation or function is registered in the binary",
    )
    assert isinstance(tpu_start_failed(other_binary, "grpc://10.0.0.2:8470", "?"), InvalidParameter)


def test_this_tensorflow_without_tpu_kernels_is_refused_through_the_real_initialisation(monkeypatch):
    """No stand-in: this machine's TensorFlow (the CPU wheel) has no TPU kernel, as a TPU image whose libtpu did not
    load; with a TPU's device files found, select_strategy runs TensorFlow's own initialisation, which fails with
    the first signature, and refuses (exit 2), as every new job with the same image would fail."""
    monkeypatch.setattr(devices, "tpu_devices", lambda: [A_CHIP])
    with pytest.raises(InvalidParameter) as refused:
        select_strategy("tpu")
    assert "No OpKernel was registered to support Op 'ConfigureDistributedTPU'" in str(refused.value)
    assert "this pair cannot drive this TPU" in str(refused.value)
    assert one_line_failure(refused.value)[0] == BAD_INPUT_EXIT


def transient_errors():
    import tensorflow as tf

    return [
        tf.errors.UnavailableError(None, None, "failed to connect to all addresses; last error: Connection refused"),
        tf.errors.DeadlineExceededError(None, None, "Deadline Exceeded"),
        tf.errors.InternalError(None, None, "Failed to initialize the TPU system: TPU chip 0 not responding"),
        tf.errors.AbortedError(None, None, "The TPU system is being reconfigured"),
        tf.errors.NotFoundError(None, None, "TPU initialization failed: No TPU devices found."),
    ]


@pytest.mark.parametrize("error", transient_errors(), ids=lambda error: type(error).__name__)
def test_a_tpu_that_fails_to_start_for_a_reason_a_new_start_may_not_meet_fails_this_start_only(monkeypatch, error):
    """Each error class TensorFlow raises from the TPU's initialisation (the stand-in for initialize_tpu_system is
    the narrowest seam: the resolver, the classification and the line are the real ones): one line, exit 1 (which
    Vertex AI restarts and the launcher replaces), no refusal; ``auto`` falls back saying why."""
    import tensorflow as tf

    def initialise(resolver):
        raise error

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialise)
    with pytest.raises(AcceleratorStartFailed) as failed:
        select_strategy("tpu", "grpc://10.0.0.2:8470")
    status, line = one_line_failure(failed.value)
    assert status == 1 and "\n" not in line
    assert line.startswith(
        f"the TPU at --tpu='grpc://10.0.0.2:8470' did not start with {devices.tpu_runtime()} "
        f"({type(error).__name__}: {error.message}): an error a new start may not meet"
    )
    assert "not counted in attempts.json, and the launcher's next try creates a new job within the run's time" in line
    assert line.endswith("(make tpu-image TPU_RUNTIME=tf2.20, push it, then tpu-mlm compile ... --tpu_image <its URI>)")
    assert select_strategy("auto", "grpc://10.0.0.2:8470")[1] == "cpu"


@pytest.mark.parametrize(
    "error",
    [
        ValueError("Failed to connect to the Tensorflow master. The TPU worker may not be ready (still scheduling)"),
        RuntimeError("Cannot find any TPU cores in the system (master address grpc://10.0.0.2:8470)."),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_tpu_worker_not_ready_when_the_strategy_looks_at_its_devices_fails_this_start_only(monkeypatch, error):
    """What TPUStrategy raises from its look at the cluster's devices (tensorflow/python/tpu/tpu_system_metadata.py)
    after an initialisation that passed: a worker not ready yet, not a wrong TPU name."""
    import tensorflow as tf

    def strategy(resolver):
        raise error

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda resolver: None)
    monkeypatch.setattr(tf.distribute, "TPUStrategy", strategy)
    with pytest.raises(AcceleratorStartFailed, match=f"{type(error).__name__}: {re.escape(str(error))}"):
        select_strategy("tpu", "grpc://10.0.0.2:8470")
