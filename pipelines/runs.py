"""A pipeline run's life from the terminal, by the run's name (its Vertex AI pipeline job id, as submit prints it):
where it stands, its TPU job's log lines, its cancel.

    tpu-mlm status tpu-mlm-20260101-120000 --project my-project --region us-central1
    tpu-mlm status tpu-mlm-20260101-120000 --project my-project --follow
    tpu-mlm logs tpu-mlm-20260101-120000 --project my-project --tail 50
    tpu-mlm cancel tpu-mlm-20260101-120000 --project my-project

(``python -m pipelines.runs status|logs|cancel RUN ...`` alike). The run's TPU custom jobs are the ones the launcher
labelled with the run's name (``tpu-mlm-run``); the training's progress is what the train step wrote at its last
checkpoint in the run's checkpoint folder (``training_history.json``): figures as of that checkpoint, not of now.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

from components.lib import attempts, storage
from components.lib.errors import InvalidParameter, ServiceFailed, first_line
from components.lib.job_runner import log, run_job
from components.lib.results import HISTORY_FILE
from pipelines.run_folders import (
    PIPELINE_NAME,
    RUN_NAME_LABEL,
    run_as_flag,
    run_checkpoint_folder,
    run_label,
    run_name,
)
from pipelines.vertex_jobs import (
    CALL_RETRY_SECONDS,
    CANCEL_WAIT_SECONDS,
    FIRST_CALL_RETRY_SECONDS,
    PIPELINE_SUCCEEDED,
    PIPELINE_TERMINAL_STATES,
    TERMINAL_STATES,
    JobServiceArguments,
    api_session,
    call,
    cancel_command,
    check_endpoint,
    check_project,
    check_region,
    endpoint_url,
    job_client,
    location_path,
    pipeline_client,
)

STATUS_HELP = """Where a pipeline run stands: its state, each task's, its TPU custom jobs', and the training's progress
as of its last checkpoint (step, loss, share of the run's samples done, time left, cost so far and projected).
--follow: a line at each change until the run ends; exit 0 if it succeeded, else 1.

    tpu-mlm status tpu-mlm-20260101-120000 --project my-project --region us-central1 [--follow]
"""
LOGS_HELP = """The log lines of a run's TPU job (its latest, or --job ID), from Cloud Logging. The same with gcloud:

    gcloud logging read 'resource.type="ml_job" AND resource.labels.job_id="JOB_ID"' --project=my-project \\
        --order=asc --format='value(textPayload)'

    tpu-mlm logs tpu-mlm-20260101-120000 --project my-project --region us-central1 [--tail 50]
"""
CANCEL_HELP = """Cancels a pipeline run and every TPU job of it still going, after asking (--yes: without; with no
terminal to ask on, --yes is required), then waits for them to end and prints their final states. A run that has
ended is left as it is.

    tpu-mlm cancel tpu-mlm-20260101-120000 --project my-project --region us-central1 [--yes]
"""
LOGGING_ENDPOINT = "https://logging.googleapis.com"
# entries.list's largest page as its proto documents it (newer docs drop the cap): the fewest rate-limited requests
MAX_PAGE_SIZE = 1000


@dataclass(kw_only=True)
class RunArguments:
    """Which run, and where it is."""

    run: str = field(
        metadata={"help": "The run's name as submit prints it, or its resource name; also taken as the first word."}
    )
    project: str = field(metadata={"help": "Google Cloud project id."})
    region: str = field(default="us-central1", metadata={"help": "Vertex AI region the run is in."})

    def __post_init__(self) -> None:
        self.run = run_name(self.run)
        check_project(self.project)  # in every resource name the command sends
        check_region(self.region)


@dataclass(kw_only=True)
class StatusArguments(JobServiceArguments, RunArguments):
    follow: bool = field(
        default=False, metadata={"help": "Print a line at each change (every --poll_seconds) until the run ends."}
    )


@dataclass(kw_only=True)
class LogsArguments(RunArguments):
    api_endpoint: str = field(
        default="", metadata={"help": "Vertex AI's endpoint; default: the region's, REGION-aiplatform.googleapis.com."}
    )
    logging_endpoint: str = field(default=LOGGING_ENDPOINT, metadata={"help": "Cloud Logging's endpoint."})
    tail: int = field(default=0, metadata={"help": "Only the last N lines; 0: all."})
    job: str = field(default="", metadata={"help": "The TPU job's numeric id; default: the run's latest TPU job."})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_endpoint("api_endpoint", self.api_endpoint)
        # requests, unlike Google's clients, needs a scheme: a bare host is taken as https://, as a browser takes it
        self.logging_endpoint = endpoint_url(check_endpoint("logging_endpoint", self.logging_endpoint))
        if self.tail < 0:
            raise InvalidParameter("tail", self.tail, "must be 0 (all lines) or above")


@dataclass(kw_only=True)
class CancelArguments(JobServiceArguments, RunArguments):
    yes: bool = field(default=False, metadata={"help": "Cancel without asking."})


class Run:
    """A run as Vertex AI has it: its pipeline job and its TPU custom jobs, through the pipeline and job services."""

    def __init__(self, arguments: RunArguments, api_endpoint: str, reached: bool = False) -> None:
        self.name, self.project, self.region = arguments.run, arguments.project, arguments.region
        self.resource = f"{location_path(self.project, self.region)}/pipelineJobs/{self.name}"
        self.pipelines = pipeline_client(self.region, api_endpoint)
        self.jobs = job_client(self.region, api_endpoint)
        self.reached = reached  # until Vertex AI has answered once, a transient error is retried briefly

    def pipeline_job(self) -> Any:
        """The run's pipeline job; a name that is no run there, or the run of another pipeline (whose folders and jobs
        are not this project's to read, cancel or delete), is refused in one line."""
        from google.api_core.exceptions import NotFound

        retry_seconds = CALL_RETRY_SECONDS if self.reached else FIRST_CALL_RETRY_SECONDS
        try:
            pipeline_job = call(self.pipelines.get_pipeline_job, retry_seconds, name=self.resource)
        except NotFound:
            raise InvalidParameter(
                "run", self.name, f"no such pipeline run in project {self.project}, region {self.region}"
            ) from None
        self.reached = True
        pipeline = pipeline_name(pipeline_job)
        if pipeline != PIPELINE_NAME:
            raise InvalidParameter(
                "run",
                self.name,
                f"is a run of the pipeline {pipeline or '(unnamed)'!r}, not of {PIPELINE_NAME}: tpu-mlm reads, cancels "
                "and deletes only its own runs",
            )
        return pipeline_job

    def tpu_jobs(self) -> list[Any]:
        """The run's TPU custom jobs, oldest first: those the launcher labelled with the run's name."""
        query = f'labels.{RUN_NAME_LABEL}="{run_label(self.name)}"'
        request = {"parent": location_path(self.project, self.region), "filter": query}
        return sorted(call(self.jobs.list_custom_jobs, request=request), key=lambda job: job.create_time)

    @property
    def console(self) -> str:
        return (
            f"https://console.cloud.google.com/vertex-ai/locations/{self.region}/pipelines/runs/{self.name}"
            f"?project={self.project}"
        )


def pipeline_name(pipeline_job: Any) -> str:
    """The name of the pipeline a pipeline job runs, as its compiled spec says."""
    spec = pipeline_job.pipeline_spec or {}
    info = spec.get("pipelineInfo") or {}
    return str(info.get("name") or "")


# where a task is done with (NOT_TRIGGERED: its condition was not met, as the push's without a Hub repository)
TASK_DONE = ("SUCCEEDED", "SKIPPED", "NOT_TRIGGERED")


def tasks(pipeline_job: Any) -> list[tuple[str, str]]:
    """Each task's name and state, in Vertex AI's order, the root task (the pipeline itself, no parent) left out; a
    name may come more than once (a loop's tasks, once an iteration)."""
    details = pipeline_job.job_detail.task_details
    return [(task.task_name, task.state.name) for task in details if task.parent_task_id]


def training_progress(pipeline_job: Any, name: str) -> dict[str, Any]:
    """The training as of its last checkpoint, from the run's checkpoint folder: the last point of the history the
    train step wrote there, and its attempts (each start of the train step, and how it ended)."""
    config = pipeline_job.runtime_config
    folder = run_checkpoint_folder(dict(config.parameter_values), config.gcs_output_directory, name)
    try:
        return checkpoint_progress(folder)
    except Exception as error:  # the bucket's objects, not readable with these credentials: the rest is shown
        return {"checkpoint_folder": folder, "unreadable": f"{type(error).__name__}: {first_line(error)}"}


def checkpoint_progress(folder: str) -> dict[str, Any]:
    """The last point of the training history in the checkpoint folder ``folder``, and its attempts."""
    progress: dict[str, Any] = {"checkpoint_folder": folder}
    tries = storage.join(folder, attempts.FILE)
    if storage.exists(tries):
        records = json.loads(storage.read_text(tries))
        last = records[-1]
        progress["attempts"] = (
            f"{len(records)}, the last {last['outcome']} from step {last['step']} (started {last['started']})"
        )
    history = storage.join(folder, HISTORY_FILE)
    points = json.loads(storage.read_text(history)) if storage.exists(history) else []
    if not points:
        return progress
    point = points[-1]
    samples_left = point["eta_seconds"] * point["samples_per_second"]
    written = storage.modified_seconds(history)  # with the checkpoint, just before it
    progress.update(
        checkpoint_time=f"{datetime.fromtimestamp(written, UTC):%Y-%m-%d %H:%M:%S} UTC",
        step=int(point["step"]),
        loss=point["loss"],
        share_done=point["samples"] / ((point["samples"] + samples_left) or 1),
        eta_seconds=point["eta_seconds"],
    )
    progress.update({key: point[key] for key in ("cost_so_far", "projected_cost") if key in point})
    return progress


def run_status(run: Run) -> dict[str, Any]:
    pipeline_job = run.pipeline_job()
    summary = {
        "run": run.name,
        "state": pipeline_job.state.name,
        "console": run.console,
        "tasks": tasks(pipeline_job),
        "tpu_jobs": {job.name: job.state.name for job in run.tpu_jobs()},
        "training": training_progress(pipeline_job, run.name),
    }
    if pipeline_job.error.message:
        summary["error"] = pipeline_job.error.message
    return summary


def progress_line(training: dict[str, Any]) -> str:
    """The training's figures in a line, said to be as of its last checkpoint."""
    if "unreadable" in training:
        return f"{training['checkpoint_folder']} not readable here ({training['unreadable']}; storage.objects.get)"
    if "step" not in training:
        return f"no checkpoint yet in {training['checkpoint_folder']}"
    line = (
        f"step {training['step']:,}, loss {training['loss']:.4f}, {training['share_done']:.1%} of the run's samples, "
        f"ETA {timedelta(seconds=round(training['eta_seconds']))}"
    )
    if "cost_so_far" in training:
        line += f", ${training['cost_so_far']:,.2f} so far of about ${training['projected_cost']:,.2f}"
    return f"{line} (as of the last checkpoint, {training['checkpoint_time']})"


def status_lines(summary: dict[str, Any]) -> str:
    """The status for people: the run, its tasks, its TPU jobs, the training."""
    width = max((len(task) for task, _ in summary["tasks"]), default=0)
    lines = [f"run {summary['run']}: {summary['state']}", f"console: {summary['console']}"]
    lines += [f"the run's error: {summary['error']}"] if "error" in summary else []
    lines += ["tasks:", *(f"  {task:<{width}}  {state}" for task, state in summary["tasks"])]
    lines += ["TPU jobs:", *(f"  {job}  {state}" for job, state in summary["tpu_jobs"].items())]
    if not summary["tpu_jobs"]:
        lines.append("  none yet")
    lines.append(f"training: {progress_line(summary['training'])}")
    if "attempts" in summary["training"]:
        lines.append(f"attempts: {summary['training']['attempts']}")
    return "\n".join(lines)


def one_line(summary: dict[str, Any]) -> str:
    """The status in a line, for --follow: what changes as the run goes."""
    going = [f"{task} {state}" for task, state in summary["tasks"] if state not in ("PENDING", *TASK_DONE)]
    done = sum(state in TASK_DONE for _, state in summary["tasks"])
    jobs = ", ".join(f"{job.rsplit('/', 1)[-1]} {state}" for job, state in summary["tpu_jobs"].items())
    parts = [
        summary["state"],
        ", ".join([f"tasks {done}/{len(summary['tasks'])} done", *going]),
        *([f"TPU jobs {jobs}"] if jobs else []),
        progress_line(summary["training"]),
    ]
    return "; ".join(parts)


def status(arguments: StatusArguments, reached: bool = False) -> dict[str, Any]:
    """The run's status; with --follow, its status once it has ended. ``reached``: Vertex AI has just answered
    (submit took the run), so a transient outage is waited out from the first call."""
    run = Run(arguments, arguments.api_endpoint, reached)
    summary = run_status(run)
    return follow(run, summary, arguments.poll_seconds) if arguments.follow else summary


def follow(run: Run, summary: dict[str, Any], poll_seconds: float) -> dict[str, Any]:
    """Prints the run's status in a line at each change, looking every ``poll_seconds``, until the run ends; returns
    its last status if it succeeded, else fails saying how it ended."""
    printed = ""
    while True:
        line = one_line(summary)
        if line != printed:
            print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)
            printed = line
        if summary["state"] in PIPELINE_TERMINAL_STATES:
            break
        time.sleep(poll_seconds)
        summary = run_status(run)
    if summary["state"] != PIPELINE_SUCCEEDED:
        raise ServiceFailed(f"{run.name} ended {summary['state']}: {summary.get('error') or 'no error given'}")
    return summary


def list_entries_page(session: Any, url: str, body: dict[str, Any], retry: Any, timeout: float) -> dict[str, Any]:
    """One ``entries.list`` request, retried by ``retry`` (``vertex_jobs.call``'s) on transient errors."""
    from google.api_core import exceptions

    def post() -> dict[str, Any]:
        response = session.post(url, json=body, timeout=timeout)
        if not response.ok:
            raise exceptions.from_http_response(response)
        return response.json()

    return retry(post)()


def job_log_filter(job_id: str) -> str:
    """Cloud Logging's query for a custom job's lines (gcloud ai custom-jobs stream-logs's)."""
    return f'resource.type="ml_job" AND resource.labels.job_id="{job_id}"'


def gcloud_logs_command(project: str, job_id: str) -> str:
    words = ["gcloud", "logging", "read", job_log_filter(job_id), f"--project={project}", "--order=asc"]
    return shlex.join([*words, "--format=value(textPayload)"])


def log_entries(session: Any, endpoint: str, project: str, job_id: str, order: str, page_size: int) -> Iterator[dict]:
    """The TPU job's log entries in ``order`` ("timestamp asc" or "desc"), a page at a time as they are read (a page
    may come empty with a token for more: the search is not over)."""
    body: dict[str, Any] = {
        "resourceNames": [f"projects/{project}"],
        "filter": job_log_filter(job_id),
        "orderBy": order,
        "pageSize": page_size,
    }
    while True:
        page = call(list_entries_page, session=session, url=f"{endpoint}/v2/entries:list", body=body)
        yield from page.get("entries", [])
        if not page.get("nextPageToken"):
            return
        body["pageToken"] = page["nextPageToken"]


def entry_text(entry: dict[str, Any]) -> str | None:
    """What an entry says: its text, or its structured payload's message (Vertex AI's own, about the job); None for
    an entry with neither."""
    return entry.get("textPayload", entry.get("jsonPayload", {}).get("message"))


def logs(arguments: LogsArguments) -> dict[str, Any]:
    """Prints the TPU job's log lines as they are read, or its last ``--tail`` lines."""
    run = Run(arguments, arguments.api_endpoint)
    run.pipeline_job()  # a name that is no run is refused as such, not as a run without jobs
    jobs = {job.name.rsplit("/", 1)[-1]: job for job in run.tpu_jobs()}
    if not jobs:
        raise ServiceFailed(f"{run.name} has no TPU job yet (its train task creates it): tpu-mlm status {run.name}")
    if arguments.job and arguments.job not in jobs:
        raise InvalidParameter("job", arguments.job, f"is not a TPU job of {run.name}; its jobs: {', '.join(jobs)}")
    job_id = arguments.job or list(jobs)[-1]
    if len(jobs) > 1:
        log.info("%s has %d TPU jobs (%s): the lines of %s", run.name, len(jobs), ", ".join(jobs), job_id)
    log.info("the same with gcloud: %s", gcloud_logs_command(run.project, job_id))
    session = api_session(arguments.logging_endpoint)
    tail = arguments.tail
    order, size = ("timestamp desc", min(tail, MAX_PAGE_SIZE)) if tail else ("timestamp asc", MAX_PAGE_SIZE)
    entries = log_entries(session, arguments.logging_endpoint, run.project, job_id, order, size)
    if tail:  # the newest first, then in their order
        entries = reversed(list(islice(entries, tail)))
    count = 0
    for entry in entries:
        text = entry_text(entry)
        if text is not None:
            print(text, flush=True)
            count += 1
    if not count:
        log.warning("no log lines of %s (%s) yet", jobs[job_id].name, jobs[job_id].state.name)
    return {"job": jobs[job_id].name, "lines": count}


def confirmed(arguments: CancelArguments, targets: list[str]) -> bool:
    """Whether the cancel of ``targets`` is wanted: --yes, or a yes at the terminal; with no terminal to ask on and
    no --yes, refused."""
    if arguments.yes:
        return True
    what = f"{arguments.run} ({len(targets)} job(s): {', '.join(targets)})"
    if not sys.stdin.isatty():
        raise InvalidParameter("yes", False, f"no terminal to ask on: add --yes to cancel {what}")
    return input(f"Cancel {what}? [y/N] ").strip().lower() in ("y", "yes")


def wait_until_ended(run: Run, names: list[str], poll_seconds: float) -> dict[str, str]:
    """Each of ``names`` (the pipeline job, TPU jobs) and its state once all have ended; fails past
    ``CANCEL_WAIT_SECONDS`` saying which have not."""
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    while True:
        states = {name: state_of(run, name) for name in names}
        going = [name for name, state in states.items() if state not in (*TERMINAL_STATES, *PIPELINE_TERMINAL_STATES)]
        if not going:
            return states
        if time.monotonic() > deadline:
            raise ServiceFailed(
                f"asked to cancel, still going after {CANCEL_WAIT_SECONDS:.0f} s: "
                + ", ".join(f"{name} {states[name]}" for name in going)
                + f"; see {run.console}"
            )
        time.sleep(poll_seconds)


def state_of(run: Run, name: str) -> str:
    if name == run.resource:
        return run.pipeline_job().state.name
    return call(run.jobs.get_custom_job, name=name).state.name


def cancel(arguments: CancelArguments) -> dict[str, Any]:
    """Cancels the run's pipeline job and TPU jobs that are still going, once confirmed, and waits for them to end."""
    from google.api_core.exceptions import GoogleAPICallError

    run = Run(arguments, arguments.api_endpoint)
    pipeline_job = run.pipeline_job()
    going = [job.name for job in run.tpu_jobs() if job.state.name not in TERMINAL_STATES]
    run_going = pipeline_job.state.name not in PIPELINE_TERMINAL_STATES
    targets = ([run.resource] if run_going else []) + going
    if not targets:
        return {"run": run.name, "state": pipeline_job.state.name, "cancelled": {}}
    if not confirmed(arguments, targets):
        return {"run": run.name, "state": pipeline_job.state.name, "cancelled": {}, "declined": True}
    if run_going:
        try:
            call(run.pipelines.cancel_pipeline_job, name=run.resource)
        except GoogleAPICallError:  # refused once the run has ended meanwhile (FAILED_PRECONDITION): nothing to do
            if run.pipeline_job().state.name not in PIPELINE_TERMINAL_STATES:
                raise
    for name in going:
        try:
            call(run.jobs.cancel_custom_job, name=name)
        except GoogleAPICallError as error:
            raise ServiceFailed(f"could not cancel {name} ({error}); cancel it with: {cancel_command(name)}") from None
    log.info("asked to cancel %s; waiting for them to end", ", ".join(targets))
    ended = wait_until_ended(run, targets, arguments.poll_seconds)
    return {"run": run.name, "state": ended.get(run.resource, pipeline_job.state.name), "cancelled": ended}


def cancel_lines(summary: dict[str, Any]) -> str:
    if summary.get("declined"):
        return f"not cancelled: {summary['run']} is {summary['state']}"
    if not summary["cancelled"]:
        return f"{summary['run']} has already ended ({summary['state']}): nothing to cancel"
    return "\n".join(f"{name}: {state}" for name, state in summary["cancelled"].items())


def status_main(argv: Sequence[str] | None = None) -> int:
    """Where a pipeline run stands (tpu-mlm status)."""
    return run_job(
        StatusArguments,
        status,
        run_as_flag(argv),
        description=STATUS_HELP,
        for_people=status_lines,
        subcommand="status",
    )


def logs_main(argv: Sequence[str] | None = None) -> int:
    """A pipeline run's TPU job's log lines (tpu-mlm logs)."""
    return run_job(
        LogsArguments, logs, run_as_flag(argv), description=LOGS_HELP, print_summary=False, subcommand="logs"
    )


def cancel_main(argv: Sequence[str] | None = None) -> int:
    """Cancels a pipeline run and its TPU jobs (tpu-mlm cancel)."""
    return run_job(
        CancelArguments,
        cancel,
        run_as_flag(argv),
        description=CANCEL_HELP,
        for_people=cancel_lines,
        subcommand="cancel",
    )


JOBS = {"status": status_main, "logs": logs_main, "cancel": cancel_main}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.runs JOB RUN [ARGS]``, JOB one of status, logs, cancel."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in JOBS:
        print(f"usage: python -m pipelines.runs {{{','.join(JOBS)}}} RUN [ARGS]\n\n{__doc__}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return JOBS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
