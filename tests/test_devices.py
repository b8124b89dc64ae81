"""``devices``: TPU chips found by their PCI ids, the TPU runtime kept out where no TPU is used, strategies, peaks."""

import logging
import os
import re
from pathlib import Path

import pytest

from components.lib import devices
from components.lib.devices import (
    NO_TPU_DEVICE,
    peak_tflops_per_replica,
    prepare_runtime,
    select_strategy,
    slice_or,
    tpu_devices,
    tpu_init_failed,
)
from components.lib.errors import InvalidParameter
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


def test_a_tpu_its_runtime_cannot_initialise_is_one_line_naming_the_pair_and_the_other_image(monkeypatch):
    import tensorflow as tf

    no_kernel = tf.errors.InvalidArgumentError(
        None,
        None,
        "No OpKernel was registered to support Op 'ConfigureDistributedTPU' used by {{node ConfigureDistributedTPU}}"
        ' with these attrs: [embedding_config="", is_global_init=false]\nRegistered devices: [CPU]\n\t [[{{node '
        "ConfigureDistributedTPU}}]] [Op:__inference__tpu_init_fn_4]",
    )
    line = f"error: {tpu_init_failed(no_kernel, 'local', 'tensorflow-tpu 2.19.1 + libtpu 0.0.10')}"
    assert "\n" not in line and "[[" not in line
    assert line.startswith(
        "error: --accelerator='tpu': TensorFlow could not initialise the TPU at --tpu='local' with tensorflow-tpu "
        "2.19.1 + libtpu 0.0.10 (InvalidArgumentError: No OpKernel was registered to support Op "
        "'ConfigureDistributedTPU'"
    )
    assert line.endswith(
        "try the other TPU image, tf2.20 (make tpu-image TPU_RUNTIME=tf2.20, push it, then tpu-mlm compile ... "
        "--tpu_image <its URI>)"
    )
    not_found = tf.errors.NotFoundError(None, None, "TPU initialization failed: No TPU devices found.")
    line = str(tpu_init_failed(not_found, "local", "tensorflow-tpu 2.20.0 + libtpu 0.0.14"))
    assert "with tensorflow-tpu 2.20.0 + libtpu 0.0.14 (NotFoundError: TPU initialization failed" in line
    assert "try the other TPU image, tf2.19 (make tpu-image TPU_RUNTIME=tf2.19," in line
    assert len(str(tpu_init_failed(tf.errors.InternalError(None, None, "x" * 5000), "local", "?"))) < 700

    # select_strategy turns TensorFlow's errors at the TPU's initialisation into that line (a TPU by address: no
    # device files looked for)
    def initialise(resolver):
        raise no_kernel

    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialise)
    with pytest.raises(InvalidParameter, match=r"initialise the TPU at --tpu='grpc://10.0.0.2:8470' with .* \(Inv"):
        select_strategy("tpu", "grpc://10.0.0.2:8470")
