"""Try a TPU type and image before the first real run: one short Vertex AI custom job on that TPU, with that image
and runtime settings, runs the real train step at the run's model, batch and precision on data it makes itself
(``pipelines.smoke_job``), and reports what it found and a verdict. Its hard limit is ``--timeout_minutes``, and it
is never retried: a TPU that does not start costs minutes, not a pipeline run.

The job writes under ``--scratch`` (``gs://``), in a folder of its own; this command waits for the job, prints
the report it wrote (``smoke.json``) and exits 0 on a pass. ``--dry_run`` prints the job and sends nothing.

    python -m pipelines.submit_smoke --project my-project --scratch gs://my-bucket/smoke --tpu_type v5e-8 \\
        --tpu_image us-central1-docker.pkg.dev/my-project/tpu-mlm/tpu:0.1.0 \\
        --service_account trainer@my-project.iam.gserviceaccount.com
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter, ServiceFailed
from components.lib.job_runner import log, run_job
from components.lib.tpu_catalogue import (
    ON_DEMAND,
    PRICES,
    SPOT,
    TPU_PROVISIONING,
    TPU_TYPES,
    check_tpu_provisioning,
    tpu_runtime_env,
    tpu_type,
)
from pipelines.compile import check_image_uri
from pipelines.quota import QuotaArguments, require_tpu_quota
from pipelines.smoke_job import REPORT_FILE, SmokeArguments, SmokeRun, describe, host_reports, run_settings
from pipelines.submit import check_project, check_service_account
from pipelines.vertex_jobs import (
    JobServiceArguments,
    JobWait,
    VertexProject,
    create_job,
    job_client,
    location_path,
    tpu_worker_pool,
)

MAX_TIMEOUT_MINUTES = 120
MAX_QUEUED_MINUTES = 24 * 60


@dataclass(kw_only=True)
class SmokeJobArguments(VertexProject, JobServiceArguments, QuotaArguments, SmokeRun):
    """Where and how the smoke job runs, and the run it tries."""

    tpu_type: str = field(
        default="v3-8", metadata={"help": "The TPU to try, as the run will have it.", "choices": list(TPU_TYPES)}
    )
    scratch: str = field(metadata={"help": "gs:// folder; the job writes its data, model and smoke.json under it."})
    tpu_image: str = field(metadata={"help": "The TPU image the pipeline's train step will run."})
    tpu_provisioning: str = field(
        default=ON_DEMAND,
        metadata={"help": "On demand (STANDARD) or SPOT, as the run will be.", "choices": TPU_PROVISIONING},
    )
    tpu_env: list[str] = field(
        default_factory=list,
        metadata={"help": "Changes to the job's runtime environment, KEY=VALUE (KEY= drops a default), as compile's."},
    )
    timeout_minutes: int = field(
        default=20,
        metadata={"help": f"Hard limit of the job (TPU start, compile, steps, save); at most {MAX_TIMEOUT_MINUTES}."},
    )
    max_queued_minutes: float = field(
        default=30.0,
        metadata={
            "help": "How long the job may stay queued or pending (no TPU capacity or quota) before it is cancelled; "
            f"at most {MAX_QUEUED_MINUTES}."
        },
    )
    dry_run: bool = field(default=False, metadata={"help": "Print the job instead of creating it."})

    def __post_init__(self) -> None:
        tpu = tpu_type(self.tpu_type)  # a TPU, not SmokeRun's "none"
        super().__post_init__()
        if not self.scratch.startswith("gs://"):
            raise InvalidParameter("scratch", self.scratch, "must be a gs:// folder: the job on Vertex AI writes there")
        for parameter in ("train_shards", "tokenizer"):
            if getattr(self, parameter) and not getattr(self, parameter).startswith("gs://"):
                raise InvalidParameter(
                    parameter, getattr(self, parameter), "must be a gs:// folder: the job on Vertex AI reads it"
                )
        storage.check_uri("scratch", self.scratch)
        check_project(self.project)
        check_service_account(self.service_account, "the job runs as Vertex AI's Custom Code Service Agent")
        check_image_uri("tpu_image", self.tpu_image)
        check_tpu_provisioning(self.tpu_provisioning, tpu)
        if not 5 <= self.timeout_minutes <= MAX_TIMEOUT_MINUTES:
            raise InvalidParameter(
                "timeout_minutes", self.timeout_minutes, f"must be from 5 to {MAX_TIMEOUT_MINUTES} minutes"
            )
        if not 0 < self.max_queued_minutes <= MAX_QUEUED_MINUTES:
            raise InvalidParameter(
                "max_queued_minutes", self.max_queued_minutes, f"must be above 0 and at most {MAX_QUEUED_MINUTES}"
            )
        tpu_runtime_env(self.tpu_env)  # its errors, before anything is sent
        check_the_job_fits(self)


def check_the_job_fits(arguments: SmokeJobArguments) -> None:
    """A run the memory estimate says cannot fit is refused before the TPU is taken (a tight one is what the
    smoke test is there to try), and so are steps the estimate says the job's time limit cannot hold."""
    from components.lib.estimates import EstimateArguments, check_memory_fit, estimate_run

    steps = arguments.steps + arguments.peak_probe_steps
    estimate = estimate_run(
        EstimateArguments(**run_settings(arguments, EstimateArguments), max_steps=steps, allow_tight_memory=True)
    )
    check_memory_fit(estimate["memory"], arguments.per_replica_batch_size)
    minutes = estimate["hours"] * 60
    if minutes > arguments.timeout_minutes:
        raise InvalidParameter(
            "timeout_minutes",
            arguments.timeout_minutes,
            f"cannot hold the {steps} steps (the smoke's and the peak probe's), about {minutes:.0f} min at "
            f"{estimate['mfu']:.0%} MFU before any compile: raise it (at most {MAX_TIMEOUT_MINUTES}) or probe fewer "
            "steps",
        )


def in_job_arguments(arguments: SmokeJobArguments, folder: str) -> list[str]:
    """The command line of ``pipelines.smoke_job`` in the job: the run's settings, the TPU, the job's folder."""
    run = SmokeArguments(scratch=folder, accelerator="tpu", exit_zero=True, **run_settings(arguments, SmokeArguments))
    line = []
    for name in fields(SmokeArguments):
        value = getattr(run, name.name)
        line += [f"--{name.name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return line


def smoke_custom_job(arguments: SmokeJobArguments, folder: str) -> Any:
    """The ``aiplatform_v1.CustomJob`` that runs the smoke test on the TPU, writing under ``folder``."""
    from google.cloud import aiplatform_v1 as vertex
    from google.protobuf import duration_pb2

    tpu = tpu_type(arguments.tpu_type)
    pool = tpu_worker_pool(
        tpu,
        arguments.tpu_image,
        ["python", "-m", "pipelines.smoke_job"],
        in_job_arguments(arguments, folder),
        tpu_runtime_env(arguments.tpu_env),
        report_dir=folder,
    )
    scheduling = vertex.Scheduling(
        timeout=duration_pb2.Duration(seconds=arguments.timeout_minutes * 60),
        strategy=arguments.tpu_provisioning,
        disable_retries=True,  # a failing start is what the smoke test is there to show, once
        restart_job_on_worker_restart=False,
    )
    return vertex.CustomJob(
        display_name=f"tpu-mlm-smoke-{tpu.name}",
        job_spec=vertex.CustomJobSpec(
            worker_pool_specs=[pool],
            scheduling=scheduling,
            service_account=arguments.service_account,
            base_output_directory=vertex.GcsDestination(output_uri_prefix=folder),
        ),
        labels={"tpu-mlm": "smoke", "tpu-type": tpu.name},
    )


def cost_limit(arguments: SmokeJobArguments) -> str:
    """The most the job can cost: its timeout on the TPU at the TPU's list price for the provisioning."""
    tpu = tpu_type(arguments.tpu_type)
    price = tpu.list_price(arguments.tpu_provisioning)
    spot = " Spot" if arguments.tpu_provisioning == SPOT else ""
    return (
        f"at most ${price * arguments.timeout_minutes / 60:,.2f}: {arguments.timeout_minutes} min of a {tpu.name} at "
        f"${price:.2f} an hour{spot} ({PRICES})"
    )


def why_queued(arguments: SmokeJobArguments) -> str:
    """What keeps a TPU job from starting, to check when it stayed queued."""
    tpu = tpu_type(arguments.tpu_type)
    spot = f"Spot capacity (try --tpu_provisioning {ON_DEMAND}), " if arguments.tpu_provisioning == SPOT else ""
    return (
        f"check the project's Vertex AI training quota for the {tpu.name} in {arguments.region} (console: IAM & Admin "
        f"> Quotas), that {arguments.region} offers it for Vertex AI training, {spot}or try another region"
    )


def job_json(job: Any) -> str:
    """The job as the REST API takes it: enums by name, unset fields left out."""
    from google.cloud import aiplatform_v1 as vertex

    return vertex.CustomJob.to_json(job, use_integers_for_enums=False, always_print_fields_with_no_presence=False)


def run_smoke(arguments: SmokeJobArguments, client: Any = None) -> dict[str, Any]:
    """Creates the job (or prints it), waits for it and returns its report."""
    folder = storage.join(arguments.scratch, f"smoke-{arguments.tpu_type}-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    job = smoke_custom_job(arguments, folder)
    parent = location_path(arguments.project, arguments.region)
    limit = cost_limit(arguments)
    log.info("the job's cost is bounded by its timeout: %s", limit)
    if arguments.dry_run:
        return {"dry_run": True, "parent": parent, "cost_limit": limit, "would_create": json.loads(job_json(job))}
    require_tpu_quota(
        arguments, arguments.project, arguments.region, tpu_type(arguments.tpu_type), arguments.tpu_provisioning
    )
    client = client or job_client(arguments.region, arguments.api_endpoint)
    waiting = JobWait(
        client,
        arguments.poll_seconds,
        max_queued_seconds=arguments.max_queued_minutes * 60,
        why_queued=why_queued(arguments),
    )
    with waiting:  # from here a Ctrl-C cancels the job, even one being created
        created = create_job(client, arguments.project, arguments.region, job)
        log.info("created %s; its report will be %s", created.name, storage.join(folder, REPORT_FILE))
        log.info(
            "console: https://console.cloud.google.com/vertex-ai/locations/%s/training/%s?project=%s",
            arguments.region,
            created.name.rsplit("/", 1)[-1],
            arguments.project,
        )
        state = waiting.follow(created.name).state
    report_uri = storage.join(folder, REPORT_FILE)
    if not storage.exists(report_uri):
        failed = [
            f"host {host.get('host', host['hostname'])}: {host['failed']}"
            for host in host_reports(folder)
            if "failed" in host
        ]
        raise ServiceFailed(
            f"the smoke job ended {state.name} without a report at {report_uri}: the container did not get to run "
            f"the smoke test (the image not pulled, no access to the bucket, no quota, or its "
            f"{arguments.timeout_minutes}-minute limit reached before the first stage ended"
            + (f"; the slice's hosts said: {'; '.join(failed)}" if failed else "")
            + f"); see the job's logs ({created.name})"
        )
    report = json.loads(storage.read_text(report_uri))
    for line in describe(report):
        log.info(line)
    report["job"], report["job_state"] = created.name, state.name
    if report["verdict"] != "pass":
        raise SmokeFailed(report)
    return report


def summary_for_people(summary: dict[str, Any]) -> str:
    if summary.get("dry_run"):
        return f"dry run: would create a smoke job in {summary['parent']}, {summary['cost_limit']} (--json: the job)"
    return f"verdict: {summary['verdict'].upper()} ({summary['job']}; the report's lines above)"


class SmokeFailed(ServiceFailed):
    """The job ran and its report says fail: the verdict is the exit status."""

    def __init__(self, report: dict[str, Any]):
        reason = report.get("error") or "; ".join(report.get("problems", []))
        super().__init__(f"the smoke test failed on the {report['arguments']['tpu_type']}: {reason}")


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(SmokeJobArguments, run_smoke, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
