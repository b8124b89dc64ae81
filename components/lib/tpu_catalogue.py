"""The TPUs the train step runs on as Vertex AI custom jobs: their machines, replicas, peaks, memory and list
prices, how Vertex AI provisions them, the recipe's batch on each, the TPU images' runtimes and the TPU job's
runtime environment.

Hardware figures are Google's published ones (pages named beside the table); prices are list prices (``PRICES``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from components.lib.errors import InvalidParameter
from components.lib.recipe import RECIPE_GLOBAL_BATCH

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


# How long a TPU job may take to be ready to train before its start counts as failed (not a wait until the job's time
# limit that every restart and retry would pay again): the TPU's initialisation by the train step; on a slice first
# host 0's wait for every host's worker server. A slice's hosts are given to the job together, but each pulls the
# image and starts on its own: how far apart they come up is not measured (the smoke test's host reports show it).
TPU_START_MINUTES = 20.0
SLICE_HOSTS_MINUTES = 10.0
# A replacement TPU job is created only with at least its start deadline and this much left of the run's time limit:
# a job that could only start would pay the queue, the start and the compile to train nothing.
REPLACEMENT_MARGIN_MINUTES = 15.0


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
    spot_list_price_per_hour: float  # USD, Cloud TPU Spot; 0: Vertex AI offers no Spot (slices of several hosts)
    hosts: int = 1  # VMs of the slice, one container each; the train step's program runs on the first

    def list_price(self, provisioning: str) -> float:
        """The Cloud TPU list price an hour (PRICES) for Vertex AI's scheduling strategy: SPOT or on demand."""
        return self.spot_list_price_per_hour if provisioning == SPOT else self.list_price_per_hour

    def list_price_source(self, provisioning: str) -> str:
        """Where ``list_price`` comes from, for the cost lines."""
        kind = "Spot" if provisioning == SPOT else "on-demand"
        return f"the {self.name}'s {kind} list price; {PRICES}"

    @property
    def start_deadline_minutes(self) -> float:
        """The most a job on this TPU takes to be ready to train before it fails: its hosts, then its TPU."""
        return TPU_START_MINUTES + (SLICE_HOSTS_MINUTES if self.hosts > 1 else 0.0)

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
        # slices of 4-chip hosts: one worker pool of the host machine type, the slice's topology, one replica
        # (Vertex AI's multi-host v5e sample); no Spot for TPU Pods on Vertex AI
        TpuType("v5e-16", "ct5lp-hightpu-4t", "", 0, "4x4", 16, 197.0, 16.0, 19.20, 0.0, hosts=4),
        TpuType("v5e-32", "ct5lp-hightpu-4t", "", 0, "4x8", 32, 197.0, 16.0, 38.40, 0.0, hosts=8),
    )
}
# Where the TPU prices come from, said wherever one is used: Vertex AI bills custom training at its own rates (its
# CPU machines about 15% above Compute Engine's), which no stored copy of its price table gave.
PRICES = (
    "Cloud TPU list prices, us-central1, USD an hour (Cloud Billing catalog as mirrored by "
    "skypilot-org/skypilot-catalog, 2026); Vertex AI's own rates differ"
)
# The recipe's global batch is kept on every TPU type by accumulating micro-batches of TPU_MICRO_BATCH per replica:
# roberta-base in bf16 at 128 tokens and 256 per replica is "tight" on a 16 GiB replica by training_memory; 128 fits
# a v3-8's and a v5e's with room.
TPU_MICRO_BATCH = 128
# Without a TPU (a CPU, a GPU): a micro-batch any device holds, Hugging Face's run_mlm.py's per-device default, and
# no accumulation; a GPU's user gives the batch their GPU takes
DEVICE_MICRO_BATCH = 8


def default_batch(tpu_replicas: int | None) -> dict[str, int]:
    """What a batch setting of 0 means, each of the two on its own. On a TPU of ``tpu_replicas``: a micro-batch of
    TPU_MICRO_BATCH (smaller on a slice of more than 16 replicas) and as many of them as make the recipe's global
    batch (at most 16, on a v5e-1: the step's micro-batches are unrolled into its program). Without a TPU (None): a
    device's micro-batch, not accumulated."""
    if not tpu_replicas:
        return {"per_replica_batch_size": DEVICE_MICRO_BATCH, "gradient_accumulation_steps": 1}
    micro_batch = min(TPU_MICRO_BATCH, RECIPE_GLOBAL_BATCH // tpu_replicas)
    return {
        "per_replica_batch_size": micro_batch,
        "gradient_accumulation_steps": RECIPE_GLOBAL_BATCH // (micro_batch * tpu_replicas),
    }


@dataclass(kw_only=True)
class BatchSettings:
    """The batch pair, declared once for the train step, preflight, the estimate and the smoke test. 0 takes the
    accelerator's default (``default_batch``), which each of them reads once the accelerator is known
    (``resolve_batch``): the pipeline compiles 0 for both, on every target."""

    per_replica_batch_size: int = field(
        default=0,
        metadata={
            "help": "Samples per replica and micro-batch: what must fit a replica's memory. 0: the accelerator's "
            f"({TPU_MICRO_BATCH} on a TPU, less on a slice of more than 16 replicas; {DEVICE_MICRO_BATCH} elsewhere)."
        },
    )
    gradient_accumulation_steps: int = field(
        default=0,
        metadata={
            "help": "Micro-batches summed into each optimizer step: the global batch is per_replica_batch_size x "
            "replicas x this. The global batch is the hyperparameter; the micro-batch is a memory setting. 0: the "
            f"accelerator's (on a TPU as many as make the recipe's global batch of {RECIPE_GLOBAL_BATCH} at the TPU's "
            "micro-batch, whatever micro-batch is given: 2 on a v3-8, 16 on a v5e-1; 1 elsewhere)."
        },
    )

    def check_batch(self) -> None:
        """Refuses a negative value, before the accelerator is known."""
        for parameter in ("per_replica_batch_size", "gradient_accumulation_steps"):
            if getattr(self, parameter) < 0:
                raise InvalidParameter(
                    parameter, getattr(self, parameter), "must be 0 (the accelerator's default) or positive"
                )

    def resolve_batch(self, tpu_replicas: int | None) -> None:
        """Each zero made the default of a TPU of ``tpu_replicas`` (None: no TPU)."""
        self.check_batch()
        for parameter, default in default_batch(tpu_replicas).items():
            setattr(self, parameter, getattr(self, parameter) or default)


def tpu_type(name: str) -> TpuType:
    if name not in TPU_TYPES:
        raise InvalidParameter("tpu_type", name, f"must be one of {list(TPU_TYPES)}")
    return TPU_TYPES[name]


# Vertex AI's scheduling strategies for a TPU (a custom job's ``strategy``), as it spells them; its FLEX_START
# (Dynamic Workload Scheduler) takes GPU jobs only ("Schedule training jobs based on resource availability")
ON_DEMAND, SPOT = "STANDARD", "SPOT"
TPU_PROVISIONING = (ON_DEMAND, SPOT)


def check_tpu_provisioning(provisioning: str, tpu: TpuType | None = None) -> None:
    if provisioning not in TPU_PROVISIONING:
        raise InvalidParameter("tpu_provisioning", provisioning, f"must be one of {list(TPU_PROVISIONING)}")
    if provisioning == SPOT and tpu is not None and tpu.hosts > 1:
        raise InvalidParameter(
            "tpu_provisioning",
            provisioning,
            f"Vertex AI has no Spot for TPU slices of several hosts ({tpu.name}): {ON_DEMAND}",
        )


# TPU_ACCELERATOR_TYPE, which a TPU VM sets, names the TPU's generation first, as the catalogue does (v3-8), or by
# Cloud TPU's name for it (v5litepod-8 is a v5e)
CLOUD_TPU_GENERATIONS = {"v5litepod": "v5e"}


def accelerator_type_peak(accelerator_type: str) -> float | None:
    """One replica's peak on a TPU VM whose ``TPU_ACCELERATOR_TYPE`` is ``accelerator_type``; None for a TPU of a
    generation the catalogue does not list."""
    generation = accelerator_type.lower().split("-")[0]
    generation = CLOUD_TPU_GENERATIONS.get(generation, generation)
    peaks = {tpu.name.split("-")[0]: tpu.peak_tflops_per_replica for tpu in TPU_TYPES.values()}
    return peaks.get(generation)


# The TPU images' runtimes, each named after the tensorflow-tpu minor version it installs (containers/tpu.Dockerfile
# --build-arg RUNTIME, make tpu-image TPU_RUNTIME=...); the first is the default, the one to smoke test first.
TPU_RUNTIMES = ("tf2.20", "tf2.19")
