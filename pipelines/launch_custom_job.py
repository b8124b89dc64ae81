"""The pipeline's TPU task on Vertex AI: creates the train step's custom job and waits for it, in place of Google
Cloud Pipeline Components' launcher, whose arguments it takes (``--type CustomJob --project --location --payload
--gcp_resources``, the payload with the pipeline's values filled in by Vertex AI).

GCPC's launcher, when the task's ``gcp_resources`` output already records a job (a launcher restarted after its own
preemption), polls that job instead of creating one; a retried task that found a failed job there would fail again
in seconds, without a new TPU job or a resume. This launcher looks at the recorded job first:

* queued, running or done: followed;
* failed for a reason another try may not meet (a preemption, an internal error): replaced by a new job, which
  resumes from the run's checkpoints, with what is left of the run's time limit: the jobs of one task share the
  payload's ``timeout``, which preflight derived from the run's estimate;
* cancelled (someone stopped it), expired, paused, or failed for a reason another try would meet again (bad
  input, a loss that diverged, a permission, an image that does not exist): not replaced; the task fails, saying
  why.

The train step reports what it knows would happen again (bad input, a refusal of Google Cloud's, a diverged loss, a
slice that did not come up) as its verdict, in a file this launcher names in the job's environment, and ends the job
cleanly: Vertex AI restarts a worker that exits non-zero, and retries the job, each time paying for the same outcome
(``components/lib/verdict.py``). The task then fails with the verdict's status (2, 3 or 4) and its one line, and no
job replaces it. A TPU that did not start ends its job the same way with status 1: the task fails, and its next try
creates a new job (another VM) within the time left. A job that succeeded with neither a verdict nor a model is a
failure, and so is a first run whose rehearsed restart (``rehearse_restart``) restored no checkpoint.

A job queued or pending longer than the payload's ``max_wait_duration`` (the pipeline's ``tpu_max_queued_hours``,
which the API itself takes only for FLEX_START), else ``--max_queued_minutes``, is cancelled, and a SIGTERM (the
task cancelled) cancels the job it follows. The job carries the pipeline run's labels, as GCPC's launcher gives
them, and with ``--run_name`` the run's name (``tpu-mlm status``, ``logs`` and ``cancel`` find the run's TPU jobs
by it).

    python -m pipelines.launch_custom_job --type CustomJob --project my-project --location us-central1 \\
        --payload '{"display_name": "train", "job_spec": {...}}' --gcp_resources /tmp/gcp_resources
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from components.lib import storage, verdict
from components.lib.attempts import RUN_VARIABLE
from components.lib.errors import InvalidParameter, ReportedFailure, ServiceFailed
from components.lib.job_runner import NOT_RETRIED_EXITS, log, run_job
from components.lib.results import SUMMARY_FILE
from pipelines.run_folders import RUN_NAME_LABEL, run_label, run_name, run_root, tensorboard_folder
from pipelines.vertex_jobs import (
    ENDED_WITHOUT_SUCCESS,
    SUCCEEDED,
    USER_ERROR_CODES,
    JobServiceArguments,
    JobWait,
    call,
    check_region,
    create_job,
    job_client,
    location_path,
)

RESOURCE_TYPE = "CustomJob"
# the label that carries, from job to job of one task, the seconds its earlier jobs ran (the time limit is theirs)
SECONDS_USED_LABEL = "tpu-mlm-seconds-used"
SYSTEM_LABELS_VARIABLE = "VERTEX_AI_PIPELINES_RUN_LABELS"  # the run's labels (billing), as Vertex AI sets them
RUN_LABEL = "vertex-ai-pipelines-run-billing-id"  # among them, the one that names the pipeline run


@dataclass(kw_only=True)
class LaunchArguments(JobServiceArguments):
    type: str = field(metadata={"help": "What to launch: CustomJob (the only type)."})
    project: str = field(metadata={"help": "Google Cloud project id."})
    location: str = field(metadata={"help": "Vertex AI region."})
    payload: str = field(metadata={"help": "The custom job as JSON (Vertex AI's REST fields)."})
    gcp_resources: str = field(metadata={"help": "File recording the job (KFP's output parameter gcp_resources)."})
    max_queued_minutes: float = field(
        default=24 * 60.0,
        metadata={
            "help": "How long the job may stay queued or pending (no TPU capacity or quota) before it is cancelled, "
            "where the payload has no max_wait_duration (the pipeline's has: tpu_max_queued_hours)."
        },
    )

    run_name: str = field(
        default="",
        metadata={"help": "The pipeline run's name, to label the job with (tpu-mlm status finds it); none if empty."},
    )
    pipeline_root: str = field(
        default="",
        metadata={
            "help": "The pipeline run's root (gs://): a job attached to a Vertex AI TensorBoard gets its output folder "
            "under it, the run's own (ROOT/tensorboard/RUN), where Vertex AI points AIP_TENSORBOARD_LOG_DIR."
        },
    )
    min_minutes_left: float = field(
        default=0.0,
        metadata={
            "help": "Create no replacement job when less than this is left of the run's time limit (the TPU's start "
            "deadline and a margin: a job that could only start trains nothing); 0: any time left."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_region(self.location, "location")
        if self.type != RESOURCE_TYPE:
            raise InvalidParameter("type", self.type, f"must be {RESOURCE_TYPE}")
        try:
            json.loads(self.payload, strict=False)
        except ValueError as error:
            raise InvalidParameter("payload", self.payload[:80], f"is not JSON ({error})") from None
        if self.max_queued_minutes <= 0:
            raise InvalidParameter("max_queued_minutes", self.max_queued_minutes, "must be above 0")
        if self.min_minutes_left < 0:
            raise InvalidParameter("min_minutes_left", self.min_minutes_left, "must be 0 or above")
        if self.run_name:
            run_name(self.run_name, "run_name")  # an unfilled placeholder would label the job for no run

    @property
    def endpoint(self) -> str:
        return self.api_endpoint or f"https://{self.location}-aiplatform.googleapis.com"


def launch(arguments: LaunchArguments) -> dict[str, Any]:
    """Follows the task's earlier job, or creates one; returns the job's name and state once it succeeded."""
    client = job_client(arguments.location, arguments.api_endpoint.removeprefix("https://"))
    job, queue_limit = custom_job(arguments.payload)
    waiting = JobWait(
        client,
        arguments.poll_seconds,
        max_queued_seconds=queue_limit or arguments.max_queued_minutes * 60,
        why_queued="check the project's Vertex AI training quota for the TPU in the region, and Spot capacity",
    )
    with waiting:  # a SIGTERM from here on cancels the job
        earlier = recorded_job(client, arguments.gcp_resources) or latest_job_of_this_run(client, arguments, job)
        name, seconds_used = follow_or_replace(earlier) if earlier else ("", 0)
        if name:
            record_job(arguments.gcp_resources, arguments.endpoint, name)
        elif waiting.stop_signal is None:  # stopped before its job exists: none is created
            name = create(client, arguments, job, seconds_used)
        if not name:
            raise ServiceFailed(f"stopped by {signal.Signals(waiting.stop_signal).name} before the job was created")
        ended = waiting.follow(name)
    found = job_verdict(ended)
    if found is not None and found.status:  # a start that failed: the task's next try creates a new job
        raise ServiceFailed(f"{found.line} ({name}; the task's next try creates a new job)")
    if ended.state.name != SUCCEEDED:
        raise ServiceFailed(f"{name} ended {ended.state.name}: {ended.error.message or 'no error given'}")
    if found is None and verdict_file_of(ended) and not model_saved(ended):
        raise ServiceFailed(
            f"{name} ended {ended.state.name} with no verdict and no model ({trained_model(ended)}): the train step "
            "did not run to its end (its log says why: tpu-mlm logs RUN)"
        )
    if found is not None and rehearsed_restart(ended) and not found.resumed_from_step:
        raise ServiceFailed(
            f"{name} trained to its end without the rehearsed restart (rehearse_restart): no checkpoint was restored, "
            "so the first run did not prove the path a preempted run takes"
        )
    return {"job": name, "state": ended.state.name, "verdict": found.line if found else "none written"}


def recorded_job(client: Any, gcp_resources: str) -> Any:
    """The job recorded in ``gcp_resources`` (by this task's earlier try), or None."""
    if not os.path.exists(gcp_resources) or not os.path.getsize(gcp_resources):
        return None
    with open(gcp_resources) as file:
        (resource,) = json.load(file)["resources"]
    name = resource["resourceUri"].split("/v1/", 1)[1]
    from google.api_core.exceptions import NotFound

    try:
        return call(client.get_custom_job, name=name)
    except NotFound:
        log.warning("the job this task recorded, %s, is not found", name)
        return None


def latest_job_of_this_run(client: Any, arguments: LaunchArguments, job: Any) -> Any:
    """This task's latest job in this pipeline run, found by the run's label where the task was handed no record
    (whether Vertex AI hands a retry its predecessor's is not documented), or None: outside a pipeline run (no run
    label), or where the service does not take the filter."""
    run = run_labels().get(RUN_LABEL)
    if not run:
        return None
    query = f'labels.{RUN_LABEL}="{run}" AND display_name="{job.display_name}"'
    parent = location_path(arguments.project, arguments.location)
    from google.api_core.exceptions import GoogleAPICallError

    try:
        jobs = list(call(client.list_custom_jobs, request={"parent": parent, "filter": query}))
    except GoogleAPICallError as error:  # a filter the service does not take must not stop the run
        log.warning("could not look for this run's earlier jobs (%s): creating one", error)
        return None
    return max(jobs, key=lambda found: found.create_time, default=None)


def follow_or_replace(earlier: Any) -> tuple[str, int]:
    """The earlier job's name if it is to be followed (queued, running or done), else "" and the seconds the
    task's jobs have run, for its replacement. Raises ``ServiceFailed`` for a job that is not to be replaced."""
    name, state = earlier.name, earlier.state.name
    found = job_verdict(earlier)  # an outcome the step knew would repeat is not tried again
    start_failed = found is not None and found.status != 0
    if state not in ENDED_WITHOUT_SUCCESS and not start_failed:
        log.info("following this task's earlier job, %s (%s)", name, state)
        return name, 0
    why = f"{name} ended {state} ({earlier.error.code}: {earlier.error.message or 'no error given'})"
    if start_failed:
        why = f"{name}'s accelerator did not start ({found.line})"
    elif not replaceable(earlier):
        raise ServiceFailed(f"{why}: not replaced, as another job would stop or fail the same way")
    ran = earlier.end_time - earlier.start_time if earlier.start_time and earlier.end_time else None
    seconds_used = int(earlier.labels.get(SECONDS_USED_LABEL, 0)) + int(ran.total_seconds() if ran else 0)
    log.warning("this task's earlier job, %s: this retry creates a new one", why)
    return "", seconds_used


# how Vertex AI reports a job whose container exited with an error, whatever the error's code (3 in its logs)
REPLICA_EXITED = re.compile(r"exited with a non-zero status of (\d+)")


def replaceable(job: Any) -> bool:
    """Whether another job may get further than this failed one: the train step's container exited with an error
    (a preemption's SIGTERM, a crash; its own attempts.json refuses a repeated failure), but not with bad input
    (status 2), a refusal of Google Cloud's (3: a permission) or a diverged loss (4), which the same settings meet
    again; or the job failed for a reason
    that is not the user's (GCPC's list of such error codes). A job cancelled (someone stopped it), expired or
    paused is not replaced."""
    if job.state.name != "JOB_STATE_FAILED":
        return False
    exited = REPLICA_EXITED.search(job.error.message or "")
    if exited:
        return int(exited.group(1)) not in NOT_RETRIED_EXITS
    return job.error.code not in USER_ERROR_CODES


def create(client: Any, arguments: LaunchArguments, job: Any, seconds_used: int) -> str:
    """Creates ``job`` with what is left of its time limit and the run's labels, and records it."""
    limit = job.job_spec.scheduling.timeout
    if seconds_used and limit:
        left = int(limit.total_seconds()) - seconds_used
        if left <= 0:
            raise ServiceFailed(
                f"the run's TPU time limit ({limit.total_seconds() / 3600:g} h) is spent by this task's earlier jobs: "
                "no new job (raise tpu_job_timeout_hours to train on)"
            )
        if left < arguments.min_minutes_left * 60:
            raise ServiceFailed(
                f"{left / 60:.0f} min are left of the run's TPU time limit ({limit.total_seconds() / 3600:g} h), less "
                f"than a new job needs to start and train ({arguments.min_minutes_left:g} min): no new job (raise "
                "tpu_job_timeout_hours to train on)"
            )
        job.job_spec.scheduling.timeout = timedelta(seconds=left)
        log.info("the earlier jobs ran %d s of the time limit: the new job gets the %d s left", seconds_used, left)
    job.labels = {**run_labels(), **job.labels, SECONDS_USED_LABEL: str(seconds_used)}
    give_verdict_file(job)
    if job.job_spec.tensorboard and not job.job_spec.base_output_directory.output_uri_prefix:
        job.job_spec.base_output_directory.output_uri_prefix = run_output_folder(arguments, job)
    if arguments.run_name:
        job.labels[RUN_NAME_LABEL] = run_label(arguments.run_name)
        run = f"{location_path(arguments.project, arguments.location)}/pipelineJobs/{run_name(arguments.run_name)}"
        set_environment(job, RUN_VARIABLE, run)  # the attempts in its checkpoint folder name the run
    created = create_job(client, arguments.project, arguments.location, job)
    record_job(arguments.gcp_resources, arguments.endpoint, created.name)
    log.info("created %s", created.name)
    return created.name


def give_verdict_file(job: Any) -> None:
    """Names, in the environment of each of the job's containers, the file the train step writes its verdict to:
    one of this job's own in the task's folder (where its model goes). Not for a payload that runs no KFP step."""
    model = model_artifact(job)
    if not model:
        return
    from google.cloud import aiplatform_v1 as vertex

    uri = storage.join(storage.dirname(model), "verdicts", f"{uuid.uuid4().hex[:16]}.json")
    for pool in job.job_spec.worker_pool_specs:
        pool.container_spec.env.append(vertex.EnvVar(name=verdict.VERDICT_VARIABLE, value=uri))


def set_environment(job: Any, name: str, value: str) -> None:
    """Sets ``name`` to ``value`` in the environment of each of the job's containers, in place of any earlier value."""
    from google.cloud import aiplatform_v1 as vertex

    for pool in job.job_spec.worker_pool_specs:
        kept = [variable for variable in pool.container_spec.env if variable.name != name]
        del pool.container_spec.env[:]
        pool.container_spec.env.extend([*kept, vertex.EnvVar(name=name, value=value)])


def verdict_file_of(job: Any) -> str:
    """The verdict file the launcher gave ``job``; "" for a job given none."""
    for pool in job.job_spec.worker_pool_specs[:1]:
        for variable in pool.container_spec.env:
            if variable.name == verdict.VERDICT_VARIABLE:
                return variable.value
    return ""


def job_verdict(job: Any) -> verdict.Verdict | None:
    """The verdict of ``job``, if it succeeded with one (a job whose last start exited with an error has none that
    counts: a verdict ends the job cleanly, so one found there is an earlier start's); raises ``ReportedFailure``
    (the step's status and one line) for an outcome the step knew would come again (2, 3, 4)."""
    uri = verdict_file_of(job)
    found = verdict.read(uri) if uri and job.state.name == SUCCEEDED else None
    if found is not None and found.status:
        log.info(
            "%s ended %s; its verdict (%s): exit %d at step %s", job.name, job.state.name, uri, found.status, found.step
        )
    if found is not None and found.status in NOT_RETRIED_EXITS:
        raise ReportedFailure(found.status, found.line)
    return found


def rehearsed_restart(job: Any) -> bool:
    """Whether the job's train step was asked to rehearse a restart (a first run's ``rehearse_restart``)."""
    return bool(step_parameters(job).get("rehearse_restart"))


def executor_input(job: Any) -> dict[str, Any]:
    """The executor input (filled in by Vertex AI) that the job's container hands KFP's executor; {} for a job that
    runs no KFP step."""
    for pool in job.job_spec.worker_pool_specs[:1]:
        words = [*pool.container_spec.command, *pool.container_spec.args]
        if "--executor_input" in words[:-1]:
            with contextlib.suppress(ValueError):
                return json.loads(words[words.index("--executor_input") + 1], strict=False)
    return {}


def step_parameters(job: Any) -> dict[str, Any]:
    """The train step's parameter values in the job's executor input; {} for a job that runs no KFP step."""
    return executor_input(job).get("inputs", {}).get("parameterValues", {})


def model_artifact(job: Any) -> str:
    """The URI of the train step's model artifact, as the pipeline gives it; "" where the job has none."""
    artifacts = executor_input(job).get("outputs", {}).get("artifacts", {}).get("model", {}).get("artifacts", [])
    return artifacts[0].get("uri", "") if artifacts else ""


def trained_model(job: Any) -> str:
    """Where the train step saves the model: its artifact's URI, under the run's output_root when it names one (as
    the step's runner places it)."""
    return storage.relocate(model_artifact(job), step_parameters(job).get("output_root", ""))


def model_saved(job: Any) -> bool:
    """Whether the train step of ``job`` saved its model (its summary, written last, is there)."""
    model = trained_model(job)
    return bool(model) and storage.exists(storage.join(model, SUMMARY_FILE))


def run_output_folder(arguments: LaunchArguments, job: Any) -> str:
    """The output folder of a job attached to a Vertex AI TensorBoard: the run's TensorBoard folder (under its
    output_root when it names one, as submit prints it), so that its logs (AIP_TENSORBOARD_LOG_DIR, BASE/logs) sit
    beside other runs' and no two runs' logs mix in one upload."""
    if not (arguments.pipeline_root and arguments.run_name):
        raise InvalidParameter(
            "pipeline_root", arguments.pipeline_root, "a job attached to a TensorBoard needs it, and --run_name"
        )
    root = run_root(step_parameters(job), arguments.pipeline_root)
    return tensorboard_folder(root, run_name(arguments.run_name, "run_name"))


def run_labels() -> dict[str, str]:
    """The pipeline run's labels Vertex AI hands the task (its billing labels among them), or none."""
    try:
        labels = json.loads(os.environ.get(SYSTEM_LABELS_VARIABLE, "{}"))
    except ValueError:
        log.warning("%s is not JSON: the job goes without the run's labels", SYSTEM_LABELS_VARIABLE)
        return {}
    return labels if isinstance(labels, dict) else {}


def record_job(gcp_resources: str, endpoint: str, name: str) -> None:
    """Writes the job into ``gcp_resources`` as GCPC does: the console links the task to it from there."""
    resources = {"resources": [{"resourceType": RESOURCE_TYPE, "resourceUri": f"{endpoint}/v1/{name}"}]}
    os.makedirs(os.path.dirname(gcp_resources) or ".", exist_ok=True)
    with open(gcp_resources, "w") as file:
        json.dump(resources, file)


def custom_job(payload: str) -> tuple[Any, float | None]:
    """The ``aiplatform_v1.CustomJob`` of the payload, and how long it may stay queued or pending. As GCPC's
    launcher does, ``max_wait_duration`` is dropped unless the strategy is FLEX_START, the only one the API takes it
    with; for the other strategies it is the queue limit the launcher enforces itself (the pipeline's
    ``tpu_max_queued_hours``, "86400s"; None where the payload has none)."""
    from google.cloud import aiplatform_v1 as vertex

    spec = without_empty(json.loads(payload, strict=False))
    scheduling = spec.get("job_spec", {}).get("scheduling", {})
    wait = None if scheduling.get("strategy") == "FLEX_START" else scheduling.pop("max_wait_duration", None)
    return vertex.CustomJob.from_json(json.dumps(spec)), float(str(wait).removesuffix("s")) if wait else None


def without_empty(value: Any) -> Any:
    """``value`` without its fields that hold nothing (empty, 0, false), as GCPC's launcher sends a payload: the API
    reads a missing field as its default, and the compiled payload has some it would refuse empty (an unused
    accelerator type, say). Plain values inside lists stay."""
    if isinstance(value, dict):
        cleaned = {key: without_empty(item) for key, item in value.items()}
        return {key: item for key, item in cleaned.items() if item}
    if isinstance(value, list):
        cleaned = [without_empty(item) for item in value]
        return [item for item in cleaned if item or isinstance(item, int | float | str)]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(LaunchArguments, launch, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
