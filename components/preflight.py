"""Check, in minutes on a CPU, what would otherwise fail hours into a TPU run.

Before the train step takes a TPU: every training setting passes the train step's own checks (preflight
parses the very same arguments), tokenizer, shards and model config agree, with the TPU's replica count for
the batch arithmetic; the model, optimizer state and activations fit the TPU's memory per replica (estimated);
the downstream probe's tasks load (splits, columns, labels); the pipeline's storage is writable; and, when a push
is asked for, the Hub token is there and may write.
Writes ``preflight.json`` with what it checked.

    python -m components.preflight --tokenizer T --train_shards S --eval_shards V --tpu_type v3-8 --bf16 true \\
        --output OUT
"""

import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.base_model import base_model_token, load_base_weights, readable_without_token
from components.lib.downstream_tasks import TaskSelection
from components.lib.errors import InvalidParameter
from components.lib.estimates import (
    TIMEOUT_CAP_HOURS,
    check_memory_fit,
    describe_estimate,
    estimate_table,
    memory_fit,
    shards_size,
    tpu_job_timeout,
)
from components.lib.hub import HubToken, check_secret_name, hub_token
from components.lib.job_runner import run_job
from components.lib.memory_model import MemoryEstimate
from components.lib.run_shape import describe_batch_stages
from components.lib.tpu_catalogue import ON_DEMAND, TPU_PROVISIONING, TPU_TYPES, check_tpu_provisioning, tpu_type
from components.lib.training_plan import TrainingSettings, plan_training

log = logging.getLogger("tpu_mlm.preflight")

WRITE_ROLES = ("write", "admin", "fineGrained")


TENSORBOARD_NAME = re.compile(r"projects/[^/\s]+/locations/[a-z0-9-]+/tensorboards/[0-9]+")


@dataclass(kw_only=True)
class PreflightArguments(TrainingSettings, HubToken, TaskSelection):
    """The training's settings (checked as the train step checks them), with what only preflight needs."""

    output: str = field(metadata={"help": "Folder for preflight.json; also the storage checked for writing."})
    tpu_type: str = field(
        default="",
        metadata={"help": f"The TPU the train step will get, {list(TPU_TYPES)}: its replicas and memory."},
    )
    tpu_job_timeout_hours: float = field(
        default=0.0,
        metadata={
            "help": "Hard limit of the TPU training job, in hours; 0: twice the estimated training time plus an "
            "hour (at least 2 h, at most 168 h). A limit below the estimate is refused."
        },
    )
    tpu_max_queued_hours: float = field(
        default=24.0,
        metadata={
            "help": "How long the TPU job may wait queued or pending (no capacity, no quota) before it is cancelled "
            "and the train task fails, in hours (Spot capacity can take longer)."
        },
    )
    vertex_tensorboard: str = field(
        default="",
        metadata={
            "help": "A Vertex AI TensorBoard instance (projects/P/locations/REGION/tensorboards/ID) the TPU job "
            "streams its training logs to; its service account then needs roles/storage.admin and "
            "roles/aiplatform.user (Vertex AI's requirement). Empty: the logs only in ROOT/tensorboard/RUN."
        },
    )
    tpu_provisioning: str = field(
        default=ON_DEMAND,
        metadata={
            "help": "How Vertex AI gets the TPU (the custom job's scheduling strategy): STANDARD (on demand), SPOT "
            "(about a quarter of the price; preempted with 30 s notice, the train step then checkpoints and its "
            "job is run again).",
            "choices": TPU_PROVISIONING,
        },
    )
    allow_tight_memory: bool = field(
        default=False,
        metadata={
            "help": "Start a run whose memory estimate is tight (its high end above the TPU's memory) instead of "
            "refusing it: XLA may fit it, or the job may die of out-of-memory at compile."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        storage.check_uri("output", self.output)
        if not 0 <= self.tpu_job_timeout_hours <= TIMEOUT_CAP_HOURS:
            raise InvalidParameter(
                "tpu_job_timeout_hours",
                self.tpu_job_timeout_hours,
                f"must be from 0 (derived) to {TIMEOUT_CAP_HOURS:g}",
            )
        if not 0 < self.tpu_max_queued_hours <= TIMEOUT_CAP_HOURS:
            raise InvalidParameter(
                "tpu_max_queued_hours", self.tpu_max_queued_hours, f"must be above 0 and at most {TIMEOUT_CAP_HOURS:g}"
            )
        tpu = tpu_type(self.tpu_type) if self.tpu_type else None
        if tpu is not None and self.replicas not in (0, tpu.replicas):
            raise InvalidParameter("replicas", self.replicas, f"a {tpu.name} has {tpu.replicas} replicas")
        if self.hf_token_secret:
            check_secret_name(self.hf_token_secret)
        if self.vertex_tensorboard and not TENSORBOARD_NAME.fullmatch(self.vertex_tensorboard):
            raise InvalidParameter(
                "vertex_tensorboard",
                self.vertex_tensorboard,
                "must be a TensorBoard instance's resource name: projects/PROJECT/locations/REGION/tensorboards/ID",
            )
        check_tpu_provisioning(self.tpu_provisioning, tpu)

    @property
    def training_replicas(self) -> int:
        return tpu_type(self.tpu_type).replicas if self.tpu_type else self.replicas or 1


def check_hub_write(repo_id: str, token: str) -> str:
    """Who the token belongs to, after checking it is valid and may write."""
    from huggingface_hub import HfApi
    from requests import HTTPError

    try:
        identity = HfApi(token=token).whoami()
    except HTTPError as error:  # huggingface_hub raises its subclasses, or HTTPError itself for a bad token
        raise InvalidParameter("hub_repo_id", repo_id, f"the Hub refused the token: {error}") from error
    role = identity.get("auth", {}).get("accessToken", {}).get("role")
    if role not in WRITE_ROLES:
        raise InvalidParameter("hub_repo_id", repo_id, f"the Hub token may not write (its role is {role!r})")
    return identity.get("name", "")


def check_writable(parameter: str, folder: str) -> None:
    probe = storage.join(folder, ".write-probe")
    try:
        storage.write_text_atomic(probe, "ok")
        storage.remove(probe)
    except Exception as error:  # every storage backend raises its own type
        raise InvalidParameter(parameter, folder, f"is not writable: {error}") from error


def check_memory(arguments: PreflightArguments, estimate: MemoryEstimate) -> dict[str, Any]:
    """The memory estimate of one replica; a run that cannot fit the TPU's memory is refused with a batch
    that fits, and so is a tight one unless ``allow_tight_memory``."""
    fit = memory_fit(estimate, arguments.tpu_type, arguments.bf16, arguments.allow_tight_memory)
    check_memory_fit(fit, arguments.per_replica_batch_size)
    if estimate.verdict == "tight":
        log.warning(
            "memory may be short: %s; if the TPU runs out of memory, use a per-replica batch of %d",
            estimate.describe(),
            estimate.largest_batch,
        )
    else:
        log.info("memory estimate: %s", estimate.describe())
    return {key: fit[key] for key in ("low_gib", "high_gib", "verdict", "largest_per_replica_batch")}


def check_tasks(arguments: TaskSelection) -> list[dict[str, Any]]:
    """The downstream probe's tasks loaded as the probe will load them: a missing split or column, labels that are
    no classes, refused here in one line rather than after the training."""
    checked = []
    for spec in arguments.task_specs():
        task = spec.load()
        checked.append(
            {
                "task": task.name,
                "labels": list(task.label_names),
                "train_samples": len(task.train.labels),
                "validation_samples": len(task.validation.labels),
                "validation_split": task.validation_split,
            }
        )
        log.info(
            "downstream task %s: %s classes, %s samples to fine-tune on, %s to score (%s)",
            task.name,
            len(task.label_names),
            f"{len(task.train.labels):,}",
            f"{len(task.validation.labels):,}",
            task.validation_split,
        )
    return checked


def preflight(arguments: PreflightArguments) -> dict[str, Any]:
    started = time.perf_counter()
    replicas = arguments.training_replicas
    tpu = tpu_type(arguments.tpu_type) if arguments.tpu_type else None
    plan = plan_training(arguments, replicas, tpu, batch_settled=tpu is not None)
    if plan.init_from:  # its weights loaded here, on the CPU: a file without the head refused before the TPU
        if arguments.tpu_type and not readable_without_token(plan.init_from):
            raise InvalidParameter(
                "init_from",
                arguments.init_from,
                "is a private or gated Hub model, which the TPU job cannot read (it has no Hub token): copy it to a "
                "bucket (huggingface-cli download, then gcloud storage cp) and give its gs:// folder",
            )
        load_base_weights(plan.init_from, plan.config, base_model_token(plan.init_from, arguments.hf_token_secret))
    report: dict[str, Any] = {
        "tpu_type": arguments.tpu_type,
        "replicas": replicas,
        "total_steps": plan.total_steps,
        "global_batch_size": plan.global_batch_size,
        "batch_warmup": describe_batch_stages(plan.shape.batch_stages, plan.global_batch_size),
        "train_samples": plan.manifest["num_records"],
        "vocab_size": plan.config.vocab_size,
        "max_length": plan.manifest["max_length"],
        "memory": check_memory(arguments, plan.shape.memory),
    }
    if tpu is not None:
        estimate = describe_estimate(
            plan.shape,
            tpu,
            shards_size(plan.manifest, arguments.train_shards),
            bf16=arguments.bf16,
            allow_tight_memory=arguments.allow_tight_memory,
            price_given=bool(arguments.price_per_hour),
        )
        log.info("estimate of the training on the %s:\n%s", arguments.tpu_type, estimate_table(estimate))
        report["estimate"] = {key: estimate[key] for key in ("steps", "tokens", "model_flops", "hours", "cost")}
        report["tpu_job_timeout_seconds"] = tpu_job_timeout(arguments.tpu_job_timeout_hours, estimate["hours"])
        log.info("TPU job timeout: %.1f h", report["tpu_job_timeout_seconds"] / 3600)
    report["downstream_tasks"] = check_tasks(arguments)
    if arguments.hub_repo_id:
        token = hub_token("hub_repo_id", arguments.hub_repo_id, arguments.hf_token_secret)
        report["hub_user"] = check_hub_write(arguments.hub_repo_id, token)
    # last: the only checks that write (a fixed checkpoint folder is first written once the TPU has started)
    if arguments.checkpoint_dir:
        check_writable("checkpoint_dir", arguments.checkpoint_dir)
    check_writable("output", arguments.output)
    report["seconds"] = round(time.perf_counter() - started, 3)
    storage.write_text_atomic(storage.join(arguments.output, "preflight.json"), json.dumps(report, indent=2) + "\n")
    return report


def summary_for_people(report: dict[str, Any]) -> str:
    memory = report["memory"]
    lines = [
        f"every check passed: {report['train_samples']:,} training samples, global batch "
        f"{report['global_batch_size']:,} on {report['replicas']} replica(s), {report['total_steps']:,} steps",
        f"memory per replica: {memory['low_gib']:.1f}-{memory['high_gib']:.1f} GiB, {memory['verdict']}",
    ]
    if report["batch_warmup"]:
        lines.insert(1, f"batch warm-up: {report['batch_warmup']}")
    if "estimate" in report:
        estimate = report["estimate"]
        lines.append(
            f"on the {report['tpu_type']}: about {estimate['hours']:,.2f} h, ${estimate['cost']:,.2f} at list price; "
            f"TPU job timeout {report['tpu_job_timeout_seconds'] / 3600:,.1f} h"
        )
    if report["downstream_tasks"]:
        lines.append(
            "downstream tasks: "
            + ", ".join(
                f"{t['task']} ({t['train_samples']:,} + {t['validation_samples']:,})"
                for t in report["downstream_tasks"]
            )
        )
    if "hub_user" in report:
        lines.append(f"the Hub token writes as {report['hub_user']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(PreflightArguments, preflight, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
