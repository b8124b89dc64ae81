"""What this machine has to train on, and the ``tf.distribute`` strategy for it: TPU chips found by their PCI ids
(before TensorFlow loads libtpu, which off a TPU VM waits minutes), the TPU system initialised (an error every new
job with this image would meet refused in one line naming the runtime pair; any other failing this start only),
GPUs, or the CPU split into replicas; and each accelerator's peak, for MFU.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
from typing import Any

from components.lib.errors import InvalidParameter, StartFailed
from components.lib.slice_hosts import ENDPOINTS_VARIABLE
from components.lib.tpu_catalogue import TPU_RUNTIME_VARIABLES, TPU_RUNTIMES, accelerator_type_peak

log = logging.getLogger("tpu_mlm.accelerators")

ACCELERATORS = ("auto", "tpu", "gpu", "cpu")
# TPU chips on the PCI bus, as JAX and libtpu find them whatever their device files are called: Google's vendor id
# and a TPU's device id. The vendor alone is not a TPU: gVNIC, most GCE VMs' network card, is Google's too (0x0042).
TPU_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {
    "0x0027": "v2/v3",
    "0x0056": "no public name",
    "0x005e": "v4",
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "TPU7x",
}
NO_TPU_DEVICE = (
    "this machine has no TPU device: no PCI device of Google's vendor id "
    f"{TPU_PCI_VENDOR} with a TPU's device id under /sys/bus/pci/devices, and, where that folder is hidden, no "
    "/dev/accel* (TPU v2-v4) and no /dev/vfio/N (TPU v5e and later)"
)


# Peak dense bf16 (fp16 where the chip has no bf16) TFLOP/s of one GPU, from NVIDIA's data sheets.
GPU_PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "L4": 121.0, "V100": 125.0, "T4": 65.0}


def check_accelerator(accelerator: str, replicas: int) -> None:
    if accelerator not in ACCELERATORS:
        raise InvalidParameter("accelerator", accelerator, f"must be one of {ACCELERATORS}")
    if replicas < 0:
        raise InvalidParameter("replicas", replicas, "must be 0 (every device of the accelerator) or positive")


def slice_or(tpu: str) -> str:
    """The TPU to resolve: on host 0 of a slice, every host's endpoint (the slice launcher's ``TPU_SLICE_ENDPOINTS``)
    in place of ``local``; ``tpu`` elsewhere."""
    return os.environ.get(ENDPOINTS_VARIABLE, tpu) if tpu == "local" else tpu


def select_strategy(accelerator: str, tpu: str = "local", replicas: int = 0) -> tuple[Any, str]:
    """The ``tf.distribute`` strategy for ``accelerator`` (auto, tpu, gpu, cpu) and the kind found.

    ``auto`` tries a TPU, then GPUs, then the CPU, and says in one line what it fell back to. An explicit
    ``tpu`` or ``gpu`` that is not there is an error, never a silent run on the CPU. ``replicas`` (0: all
    devices) is checked against a TPU's or the GPUs' count; on the CPU, more than one splits it into as many
    logical devices under ``MirroredStrategy``: the distributed values, datasets, reductions and checkpoints a
    TPU run has, to rehearse a TPU's global batch on a laptop."""
    try_tpu = accelerator in ("auto", "tpu")
    tpu = slice_or(tpu)
    if local_tpu_missing(accelerator, tpu):
        log.info("accelerator auto: %s", NO_TPU_DEVICE)
        try_tpu = False
    if not try_tpu:
        skip_tpu_runtime()
    if replicas > 1 and accelerator in ("auto", "cpu"):
        _split_cpu(replicas)  # before anything else makes TensorFlow create its devices
    found = _tpu_strategy(accelerator, tpu) if try_tpu else None
    if found is None and accelerator in ("auto", "gpu"):
        found = _gpu_strategy(accelerator, replicas)
    if found is not None:
        return _checked(*found, replicas)
    return _cpu_strategy(replicas), "cpu"


_TPU_STRATEGIES: dict[str, Any] = {}  # by TPU address: a process connects to and initialises a TPU once


def _tpu_strategy(accelerator: str, tpu: str) -> tuple[Any, str] | None:
    """``TPUStrategy`` on the TPU at ``tpu``; None where ``auto`` found none or could not start it (an explicit
    ``tpu`` refuses, or fails for a new start to try again: ``tpu_start_failed``). A second training in the same
    process (the smoke test's peak probe) gets the same strategy: initialising the TPU again would reset it, and
    on a slice connect to every host again."""
    import tensorflow as tf

    if tpu in _TPU_STRATEGIES:
        return _TPU_STRATEGIES[tpu], "tpu"
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu)
    except ValueError as error:  # no TPU by that name
        if accelerator == "tpu":
            raise InvalidParameter(
                "accelerator", accelerator, f"no TPU found at --tpu={tpu!r} ({_first_line(error)})"
            ) from error
        return None
    try:
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        _TPU_STRATEGIES[tpu] = tf.distribute.TPUStrategy(resolver)
        return _TPU_STRATEGIES[tpu], "tpu"
    # OpError at the initialisation; ValueError ("Failed to connect to the Tensorflow master. The TPU worker may not
    # be ready") and RuntimeError ("Cannot find any TPU cores in the system") from TPUStrategy's look at the devices
    except (tf.errors.OpError, ValueError, RuntimeError) as error:
        failed = tpu_start_failed(error, tpu, tpu_runtime())
        if accelerator == "tpu":
            raise failed from error
        log.warning("accelerator auto: %s; falling back", failed)
    return None


def _gpu_strategy(accelerator: str, replicas: int) -> tuple[Any, str] | None:
    """``MirroredStrategy`` over the GPUs (``replicas`` of them; 0: all); None where ``auto`` found none."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        if accelerator == "gpu":
            raise InvalidParameter("accelerator", accelerator, "no GPU is visible to TensorFlow")
        log.info("accelerator auto: no TPU and no GPU found; training on the CPU")
        return None
    if accelerator == "auto":
        log.info("accelerator auto: no TPU found; training on %d GPU(s)", len(gpus))
    devices = [f"/gpu:{index}" for index in range(replicas or len(gpus))]
    return tf.distribute.MirroredStrategy(devices[: len(gpus)]), "gpu"


def _cpu_strategy(replicas: int) -> Any:
    """The CPU, or ``replicas`` > 1 logical devices of it under ``MirroredStrategy`` (split by ``_split_cpu``)."""
    import tensorflow as tf

    if replicas > 1:
        devices = [device.name for device in tf.config.list_logical_devices("CPU")[:replicas]]
        log.info("%d CPU replicas (logical devices) under MirroredStrategy", replicas)
        return tf.distribute.MirroredStrategy(devices)
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def tpu_runtime() -> str:
    """The TPU runtime pair installed here, as "tensorflow-tpu 2.19.1 + libtpu 0.0.10" (the packages' metadata)."""
    from importlib import metadata

    pair = []
    for name in ("tensorflow-tpu", "libtpu"):
        try:
            pair.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pair.append(f"no {name}")
    return " + ".join(pair)


class AcceleratorStartFailed(StartFailed):
    """The TPU did not start for a reason a new start may not meet (its runtime or a host not answering yet, a
    deadline, an internal error, an abort, no TPU system device): exit status 1 in one line; inside the TPU job, the
    job's verdict, and the launcher's next try creates a new job within the run's time limit; not a failure the
    attempts record counts."""


# What TensorFlow says when the image's runtime cannot drive the TPU at all, which every new job with the same image
# meets again (TensorFlow 2.20's initialize_tpu_system wraps these InvalidArgumentErrors in a NotFoundError, "TPUs
# not found in the cluster. Failed in initialization: ..."; tensorflow/python/tpu/tpu_strategy_util.py):
RUNTIME_CANNOT_DRIVE_TPU = (
    # no TPU kernel in this TensorFlow: not the TPU build, or libtpu not loaded (what the CPU wheel says here;
    # tensorflow/tensorflow#28395, google-research/google-research#651)
    "No OpKernel was registered to support Op 'ConfigureDistributedTPU'",
    # the TPU worker's TensorFlow is not the client's: the function is not in the worker's binary
    # (tensorflow/tensorflow#35700)
    "is neither a type of a primitive operation nor a name of a function registered in binary",
)


def tpu_start_failed(error: Exception, tpu: str, runtime: str) -> InvalidParameter | AcceleratorStartFailed:
    """The one line for a TPU that TensorFlow found but could not start. An error every new job with this image
    would meet again (``RUNTIME_CANNOT_DRIVE_TPU``) is a refusal naming the runtime pair and the other TPU image,
    which only a compile flag switches; anything else (``UnavailableError`` while a worker is not answering yet,
    ``DeadlineExceededError``, ``InternalError``, ``AbortedError``, "No matching devices found for
    '/device:TPU_SYSTEM:0'", which libtpu held by another process gives too: jax-ml/jax#10192) fails this start
    only."""
    version = re.match(r"tensorflow-tpu (\d+\.\d+)\.", runtime)
    others = [name for name in TPU_RUNTIMES if not version or name != f"tf{version[1]}"]
    other_image = (
        f"the other TPU image, {' or '.join(others)} (make tpu-image TPU_RUNTIME={others[0]}, push it, then tpu-mlm "
        "compile ... --tpu_image <its URI>)"
    )
    cause = _first_line(error)
    cause = f"{type(error).__name__}: {cause if len(cause) <= 300 else cause[:299] + '…'}"
    if any(signature in str(error) for signature in RUNTIME_CANNOT_DRIVE_TPU):
        return InvalidParameter(
            "accelerator",
            "tpu",
            f"TensorFlow could not initialise the TPU at --tpu={tpu!r} with {runtime} ({cause}); this pair cannot "
            f"drive this TPU, and a new job with this image would fail the same way: try {other_image}",
        )
    return AcceleratorStartFailed(
        f"the TPU at --tpu={tpu!r} did not start with {runtime} ({cause}): an error a new start may not meet (a "
        "worker not answering yet, a deadline, an internal error of the runtime); this start ends with status 1, "
        "not counted in attempts.json, and the launcher's next try creates a new job within the run's time limit. "
        f"If every start fails this way, cancel the run and try {other_image}"
    )


def _first_line(error: Exception) -> str:
    return next(iter(str(error).strip().splitlines()), "")


def prepare_runtime(accelerator: str, tpu: str = "local") -> None:
    """Before TensorFlow is imported: fails in seconds when the TPU asked for is missing from this VM, and keeps
    TensorFlow from loading libtpu where no TPU will be used (off a TPU VM it would wait minutes at the import,
    which any storage call makes, or fail to load where the library is not installed)."""
    tpu = slice_or(tpu)
    try:
        # a slice's chips belong to the hosts' worker servers: the program reaches them by gRPC, without libtpu
        missing = accelerator not in ("tpu", "auto") or tpu.startswith("grpc://")
        missing = missing or local_tpu_missing(accelerator, tpu)
    except InvalidParameter:
        skip_tpu_runtime()  # what follows the error (a report, say) may still use TensorFlow
        raise
    if missing:
        skip_tpu_runtime()


def local_tpu_missing(accelerator: str, tpu: str = "local") -> bool:
    """Whether this VM lacks the TPU that ``accelerator`` asks for (tpu) or tries first (auto), by its device
    files, before TensorFlow loads libtpu; a missing TPU asked for is an error."""
    if accelerator not in ("auto", "tpu") or tpu != "local" or tpu_devices():
        return False
    if accelerator == "tpu":
        raise InvalidParameter("accelerator", accelerator, f"no TPU found at --tpu={tpu!r} ({NO_TPU_DEVICE})")
    return True


def tpu_devices(root: str = "/") -> list[str]:
    """This machine's TPU chips, one entry each: the PCI devices with Google's vendor id and a TPU's device id or,
    where the PCI bus is hidden (some containers), the device files libtpu opens; none off a TPU VM. ``root``:
    another root to look under (the tests' stand-ins of VMs)."""
    pci = os.path.join(root, "sys/bus/pci/devices")
    if not os.path.isdir(pci):
        return sorted(glob.glob(os.path.join(root, "dev/accel*")) + glob.glob(os.path.join(root, "dev/vfio/[0-9]*")))
    return sorted(device for device in glob.glob(os.path.join(pci, "*")) if _is_tpu_chip(device))


def _is_tpu_chip(device: str) -> bool:
    return _pci_id(device, "vendor") == TPU_PCI_VENDOR and _pci_id(device, "device") in TPU_PCI_DEVICES


def _pci_id(device: str, name: str) -> str:
    try:
        with open(os.path.join(device, name)) as file:
            return file.read().strip().lower()
    except OSError:
        return ""


def skip_tpu_runtime() -> None:
    """Keeps TensorFlow from loading libtpu in this process, for a CPU or GPU run in the TPU image: off a TPU
    VM, libtpu asks the metadata server for the TPU's topology, 30 times per value, for minutes. Takes effect
    only before TensorFlow is imported."""
    for name in TPU_RUNTIME_VARIABLES:
        os.environ.pop(name, None)
    os.environ["TPU_LOAD_LIBRARY"] = "0"


def _split_cpu(replicas: int) -> None:
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    # RuntimeError: this process created its devices already; they serve if there are enough of them
    with contextlib.suppress(RuntimeError):
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    found = len(tf.config.list_logical_devices("CPU"))
    if found < replicas:
        raise InvalidParameter(
            "replicas",
            replicas,
            f"TensorFlow in this process already created {found} CPU device(s); start a new process to split the "
            "CPU into more",
        )


def _checked(strategy: Any, kind: str, replicas: int) -> tuple[Any, str]:
    if replicas and strategy.num_replicas_in_sync != replicas:
        raise InvalidParameter(
            "replicas", replicas, f"the {kind.upper()} found has {strategy.num_replicas_in_sync} replica(s)"
        )
    return strategy, kind


def peak_tflops_per_replica(kind: str, override: float | None = None) -> float | None:
    """The accelerator's peak: ``override`` (the pipeline passes the TPU type's at compile time), else from
    ``TPU_ACCELERATOR_TYPE`` on a TPU VM or the GPU's name; None when unknown (the CPU)."""
    if override:
        return override
    if kind == "tpu":
        return accelerator_type_peak(os.environ.get("TPU_ACCELERATOR_TYPE", ""))
    if kind == "gpu":
        import tensorflow as tf

        name = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
            "device_name", ""
        )
        for model, peak in GPU_PEAK_TFLOPS.items():
            if model in name.upper():
                return peak
    return None
