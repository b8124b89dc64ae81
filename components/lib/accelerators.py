"""What the training runs on: the TPU types of Vertex AI, their peaks and memory, the ``tf.distribute``
strategy for an accelerator, and whether a model and batch fit one replica's memory.

Hardware figures are Google's and NVIDIA's published ones (pages named beside each table). The memory
estimate is an estimate: it is meant to catch a run that cannot fit before a TPU is paid for, not to
replace XLA's own accounting, which only a real TPU gives.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from components.lib.errors import InvalidParameter

log = logging.getLogger("tpu_mlm.accelerators")

GIB = 1024**3
ACCELERATORS = ("auto", "tpu", "gpu", "cpu")
# How the TPU image points TensorFlow at libtpu (see containers/tpu.Dockerfile).
TPU_RUNTIME_VARIABLES = ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "NEXT_PLUGGABLE_DEVICE_USE_C_API", "TPU_LIBRARY_PATH")
# The TPU job's runtime settings by default, as Google's own TensorFlow TPU CI sets them (GoogleCloudPlatform/
# ml-auto-solutions, dags/solutions_team/configs/tensorflow/common.py): TensorFlow's PJRT runtime from libtpu.so
# (the only one v5e has) and the MLIR bridge's XLA flags. They are the custom job's environment, so a run can
# change them (compile --tpu_env KEY=VALUE) without rebuilding the image.
TPU_RUNTIME_ENV = {
    "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
    "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so",
    "TF_XLA_FLAGS": "--tf_mlir_enable_mlir_bridge=true --tf_xla_sparse_core_disable_table_stacking=true "
    "--tf_mlir_enable_convert_control_to_data_outputs_pass=true --tf_mlir_enable_merge_control_flow_pass=true",
}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def tpu_runtime_env(changes: list[str], parameter: str = "tpu_env") -> dict[str, str]:
    """The TPU job's environment: the defaults with ``KEY=VALUE`` changes (``KEY=`` drops a default)."""
    env = dict(TPU_RUNTIME_ENV)
    for change in changes:
        name, equals, value = change.partition("=")
        if not equals or not ENV_NAME.match(name):
            raise InvalidParameter(parameter, change, "must be KEY=VALUE (KEY= drops a default), KEY a variable name")
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    return env


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


@dataclass(frozen=True)
class TpuType:
    """A TPU the train step can run on as a Vertex AI custom job. A replica of ``tf.distribute`` is a
    TensorCore on v3 (two per chip) and a chip on v5e (one TensorCore each)."""

    name: str
    machine_type: str
    accelerator_type: str  # "" where Vertex AI takes a topology instead (v5e)
    accelerator_count: int
    topology: str
    replicas: int
    peak_tflops_per_replica: float  # dense bf16
    memory_gib_per_replica: float  # HBM
    list_price_per_hour: float  # USD, Cloud TPU on demand (PRICES)
    spot_list_price_per_hour: float  # USD, Cloud TPU Spot

    def list_price(self, provisioning: str) -> float:
        """The Cloud TPU list price an hour (PRICES) for Vertex AI's scheduling strategy: SPOT or on demand."""
        return self.spot_list_price_per_hour if provisioning == "SPOT" else self.list_price_per_hour

    @property
    def machine_spec(self) -> dict[str, Any]:
        """The custom job's ``machine_spec`` for this TPU."""
        if self.topology:
            return {"machine_type": self.machine_type, "tpu_topology": self.topology}
        return {
            "machine_type": self.machine_type,
            "accelerator_type": self.accelerator_type,
            "accelerator_count": self.accelerator_count,
        }


# v3: 123 bf16 TFLOP/s and 32 GiB HBM per chip of two TensorCores (cloud.google.com/tpu/docs/v3);
# v5e: 197 bf16 TFLOP/s and 16 GiB HBM per chip (cloud.google.com/tpu/docs/v5e). Vertex AI has no TensorFlow
# training on v6e and later; v5p is left out until this pipeline's v5p machine spec is tried.
# Prices: PRICES below.
TPU_TYPES: dict[str, TpuType] = {
    tpu.name: tpu
    for tpu in (
        TpuType("v3-8", "cloud-tpu", "TPU_V3", 8, "", 8, 61.5, 16.0, 8.00, 2.04),
        TpuType("v5e-1", "ct5lp-hightpu-1t", "", 0, "1x1", 1, 197.0, 16.0, 1.20, 0.245),
        TpuType("v5e-4", "ct5lp-hightpu-4t", "", 0, "2x2", 4, 197.0, 16.0, 4.80, 0.980),
        TpuType("v5e-8", "ct5lp-hightpu-8t", "", 0, "2x4", 8, 197.0, 16.0, 9.60, 1.959),
    )
}
# Where the TPU prices come from, said wherever one is used: Vertex AI bills custom training at its own rates (its
# CPU machines about 15% above Compute Engine's), which no stored copy of its price table gave.
PRICES = (
    "Cloud TPU list prices, us-central1, USD an hour (Cloud Billing catalog as mirrored by "
    "skypilot-org/skypilot-catalog, 2026); Vertex AI's own rates differ"
)
# Peak dense bf16 (fp16 where the chip has no bf16) TFLOP/s of one GPU, from NVIDIA's data sheets.
GPU_PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "L4": 121.0, "V100": 125.0, "T4": 65.0}
# TPU_ACCELERATOR_TYPE (set on TPU VMs) prefix -> peak of one replica; used only when no peak was passed in.
_TPU_ENV_PEAKS = {"v3": 61.5, "v5litepod": 197.0, "v5e": 197.0}


# The reference recipe's global batch (256 per replica on a v3-8), kept on every TPU type by accumulating
# micro-batches of TPU_MICRO_BATCH per replica: roberta-base in bf16 at 128 tokens and 256 per replica is
# "tight" on a 16 GiB replica by training_memory; 128 fits a v3-8's and a v5e's with room.
RECIPE_GLOBAL_BATCH = 2048
TPU_MICRO_BATCH = 128


def tpu_batch(tpu: TpuType) -> dict[str, int]:
    """The per-replica micro-batch and accumulation that make the recipe's global batch on ``tpu``."""
    return {
        "per_replica_batch_size": TPU_MICRO_BATCH,
        "gradient_accumulation_steps": max(1, RECIPE_GLOBAL_BATCH // (TPU_MICRO_BATCH * tpu.replicas)),
    }


def tpu_type(name: str) -> TpuType:
    if name not in TPU_TYPES:
        raise InvalidParameter("tpu_type", name, f"must be one of {sorted(TPU_TYPES)}")
    return TPU_TYPES[name]


def check_accelerator(accelerator: str, replicas: int) -> None:
    if accelerator not in ACCELERATORS:
        raise InvalidParameter("accelerator", accelerator, f"must be one of {ACCELERATORS}")
    if replicas < 0:
        raise InvalidParameter("replicas", replicas, "must be 0 (every device of the accelerator) or positive")


def select_strategy(accelerator: str, tpu: str = "local", replicas: int = 0) -> tuple[Any, str]:
    """The ``tf.distribute`` strategy for ``accelerator`` (auto, tpu, gpu, cpu) and the kind found.

    ``auto`` tries a TPU, then GPUs, then the CPU, and says in one line what it fell back to. An explicit
    ``tpu`` or ``gpu`` that is not there is an error, never a silent run on the CPU. ``replicas`` (0: all
    devices) is checked against a TPU's or the GPUs' count; on the CPU, more than one splits it into as many
    logical devices under ``MirroredStrategy``: the distributed values, datasets, reductions and checkpoints a
    TPU run has, to rehearse a TPU's global batch on a laptop."""
    try_tpu = accelerator in ("auto", "tpu")
    if local_tpu_missing(accelerator, tpu):
        log.info("accelerator auto: %s", NO_TPU_DEVICE)
        try_tpu = False
    if not try_tpu:
        skip_tpu_runtime()
    import tensorflow as tf

    if replicas > 1 and accelerator in ("auto", "cpu"):
        _split_cpu(replicas)  # before anything else makes TensorFlow create its devices
    if try_tpu:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            strategy = tf.distribute.TPUStrategy(resolver)
        except (ValueError, tf.errors.UnavailableError) as error:  # no TPU by that name, or none answering
            if accelerator == "tpu":
                raise InvalidParameter(
                    "accelerator", accelerator, f"no TPU found at --tpu={tpu!r} ({_first_line(error)})"
                ) from error
        except tf.errors.OpError as error:  # NotFoundError, InvalidArgumentError...: the runtime did not start it
            failed = tpu_init_failed(error, tpu, tpu_runtime())
            if accelerator == "tpu":
                raise failed from error
            log.warning("accelerator auto: %s; falling back", failed.expected)
        else:
            return _checked(strategy, "tpu", replicas)
    gpus = tf.config.list_physical_devices("GPU")
    if accelerator in ("auto", "gpu"):
        if gpus:
            if accelerator == "auto":
                log.info("accelerator auto: no TPU found; training on %d GPU(s)", len(gpus))
            devices = [f"/gpu:{index}" for index in range(replicas or len(gpus))]
            return _checked(tf.distribute.MirroredStrategy(devices[: len(gpus)]), "gpu", replicas)
        if accelerator == "gpu":
            raise InvalidParameter("accelerator", accelerator, "no GPU is visible to TensorFlow")
        log.info("accelerator auto: no TPU and no GPU found; training on the CPU")
    if replicas > 1:
        devices = [device.name for device in tf.config.list_logical_devices("CPU")[:replicas]]
        log.info("%d CPU replicas (logical devices) under MirroredStrategy", replicas)
        return tf.distribute.MirroredStrategy(devices), "cpu"
    return tf.distribute.OneDeviceStrategy("/cpu:0"), "cpu"


# The TPU images' runtimes, each named after the tensorflow-tpu minor version it installs (containers/tpu.Dockerfile
# --build-arg RUNTIME, make tpu-image TPU_RUNTIME=...); the first is the default, the one to smoke test first.
TPU_RUNTIMES = ("tf2.20", "tf2.19")


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


def tpu_init_failed(error: Exception, tpu: str, runtime: str) -> InvalidParameter:
    """The one line for a TPU that TensorFlow found but could not initialise (``NotFoundError``, or an
    ``InvalidArgumentError`` such as "No OpKernel was registered to support Op 'ConfigureDistributedTPU'"): the
    runtime pair that failed and the other TPU image to try, which only a compile flag switches."""
    version = re.match(r"tensorflow-tpu (\d+\.\d+)\.", runtime)
    others = [name for name in TPU_RUNTIMES if not version or name != f"tf{version[1]}"]
    cause = _first_line(error)
    cause = cause if len(cause) <= 300 else cause[:299] + "…"
    return InvalidParameter(
        "accelerator",
        "tpu",
        f"TensorFlow could not initialise the TPU at --tpu={tpu!r} with {runtime} ({type(error).__name__}: {cause}); "
        f"this pair may not run this TPU: try the other TPU image, {' or '.join(others)} (make tpu-image "
        f"TPU_RUNTIME={others[0]}, push it, then tpu-mlm compile ... --tpu_image <its URI>)",
    )


def _first_line(error: Exception) -> str:
    return next(iter(str(error).strip().splitlines()), "")


def prepare_runtime(accelerator: str, tpu: str = "local") -> None:
    """Before TensorFlow is imported: fails in seconds when the TPU asked for is missing from this VM, and keeps
    TensorFlow from loading libtpu where no TPU will be used (off a TPU VM it would wait minutes at the import,
    which any storage call makes, or fail to load where the library is not installed)."""
    try:
        missing = accelerator not in ("tpu", "auto") or local_tpu_missing(accelerator, tpu)
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
        accelerator_type = os.environ.get("TPU_ACCELERATOR_TYPE", "").lower()
        for prefix, peak in _TPU_ENV_PEAKS.items():
            if accelerator_type.startswith(prefix):
                return peak
    if kind == "gpu":
        import tensorflow as tf

        name = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
            "device_name", ""
        )
        for model, peak in GPU_PEAK_TFLOPS.items():
            if model in name.upper():
                return peak
    return None


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
