"""A run's life from the terminal (``tpu-mlm status``, ``logs``, ``cancel``) against the Vertex AI stand-in: a run
submitted by aiplatform's own ``PipelineJob.submit``, its TPU job created by the pipeline's own launcher, its progress
written by the train step's own history writer; the stand-in only reports task states, as Vertex AI's orchestrator
would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import PROJECT_ROOT, own_aiplatform_settings, run_module
from google.auth.credentials import AnonymousCredentials
from test_launch_custom_job import job, launcher, wait_for
from vertex_server import VertexStandIn

from pipelines.run_folders import checkpoint_folder, run_label

PROJECT, REGION = "my-project", "us-central1"
COMMAND_SECONDS = 120  # one command's run, its imports included: a hang fails the test with the command's output
# a run's name longer than a label value: the launcher's label and the commands' filter must cut it alike
LONG_NAME = "tpu-mlm-pretraining-a-run-whose-name-is-longer-than-any-label-value-20260101120000"


@pytest.fixture
def vertex(monkeypatch):
    """The stand-in, with aiplatform's settings pointed at it over REST for this test only (a fresh global config)."""
    from google.cloud import aiplatform

    with VertexStandIn() as stand_in:
        own_aiplatform_settings(monkeypatch)
        aiplatform.init(
            project=PROJECT,
            location=REGION,
            api_endpoint=stand_in.url,
            api_transport="rest",
            credentials=AnonymousCredentials(),
        )
        yield stand_in


def submitted(template: str, root: Path, job_id: str | None = None) -> str:
    """A run submitted as submit submits it (aiplatform's PipelineJob), its pipeline root a folder here (aiplatform's
    look for a gs:// bucket to create fails, logs its error and goes on, as it does); returns the run's name."""
    from google.cloud import aiplatform

    pipeline_job = aiplatform.PipelineJob(
        display_name="tpu-mlm-pretraining",
        template_path=template,
        pipeline_root=str(root),
        parameter_values={"corpus": "embedded"},
        job_id=job_id,
    )
    pipeline_job.submit()
    return pipeline_job.resource_name.rsplit("/", 1)[-1]


def command(vertex: VertexStandIn, job_name: str, run: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """``tpu-mlm JOB RUN ARGS`` against the stand-in, as a process of its own (no terminal: stdin is empty)."""
    where = ("--project", PROJECT, "--region", REGION, "--api_endpoint", vertex.url)
    return run_module(
        "pipelines.cli", job_name, run, *where, *args, timeout=COMMAND_SECONDS, stdin=subprocess.DEVNULL, **kwargs
    )


def resource(run: str) -> str:
    return f"projects/{PROJECT}/locations/{REGION}/pipelineJobs/{run}"


def write_training_point(folder: str, step: int, total_steps: int) -> dict:
    """The history the train step writes at a checkpoint (its log window's point, its state's writer): ``step`` of
    ``total_steps`` read at 16 samples a step in the last 100 s, the run priced at $3.60 an hour for 1,000 s so far."""
    from components.lib.run_shape import RunShape
    from components.lib.training_log import LogWindow
    from components.lib.training_plan import TrainingPlan
    from components.lib.training_state import TrainingState

    shape = RunShape(replicas=1, per_replica_batch_size=16, accumulation=1, max_length=32, steps=total_steps)
    plan = TrainingPlan(
        manifest={}, eval_manifest=None, config=None, tokenizer=None, shape=shape, checkpoint_identity={}
    )
    window = LogWindow(plan=plan, peak_tflops=None, replicas=1, price_per_hour=3.6)
    window.add(steps=step, samples=shape.samples_before(step), loss=4.2329, gradient_norm=1.0)
    window.started, window.run_started = time.perf_counter() - 100, time.perf_counter() - 1000
    point = window.point(step, learning_rate=1e-4, mlm_probability=0.15)
    state = TrainingState(
        None, None, None, None, checkpoint_dir=folder, start_step=0, history=[point], weights_finite=lambda: True
    )
    state.save_history()
    return point


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_status_shows_each_task_and_the_training_as_of_its_last_checkpoint(template, vertex, tmp_path):
    from components.lib.attempts import Attempts

    run = submitted(template, tmp_path / "root")
    vertex.set_task(resource(run), "tokenizer-step", "SUCCEEDED")
    vertex.set_task(resource(run), "train-step", "RUNNING")
    folder = checkpoint_folder(str(tmp_path / "root"), run)

    before = command(vertex, "status", run)
    assert before.returncode == 0, before.stderr[-3000:]
    lines = before.stdout.splitlines()
    assert lines[0] == f"run {run}: PIPELINE_STATE_RUNNING"
    tasks = {line.split()[0]: line.split()[1] for line in lines[lines.index("tasks:") + 1 : lines.index("TPU jobs:")]}
    assert tasks["tokenizer-step"] == "SUCCEEDED" and tasks["train-step"] == "RUNNING"
    assert tasks["evaluate-step"] == "PENDING" and "tpu-mlm-pretraining" not in tasks  # the root task is the run
    assert f"training: no checkpoint yet in {folder}" in lines

    write_training_point(folder, step=250, total_steps=1000)
    with Attempts(folder, {"settings": "these"}, ()).recorded():  # the train step's attempt, still going
        after = command(vertex, "status", run)
    assert after.returncode == 0, after.stderr[-3000:]
    (training,) = [line for line in after.stdout.splitlines() if line.startswith("training: ")]
    # a quarter of the run's samples in 100 s: 300 s to go; $3.60 an hour for 1,000 s, and for 1,300 s in all
    assert training.startswith(
        "training: step 250, loss 4.2329, 25.0% of the run's samples, ETA 0:05:00, $1.00 so far of about $1.30 "
        "(as of the last checkpoint, 20"
    )
    assert "attempts: 1, the last running from step 0" in after.stdout


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_cancel_asks_then_cancels_the_run_and_its_tpu_job_once(template, vertex, tmp_path):
    run = submitted(template, tmp_path / "root", job_id=LONG_NAME)
    vertex.set_task(resource(run), "train-step", "RUNNING")
    record = tmp_path / "gcp_resources"
    train = job("import time; print('training', flush=True); time.sleep(600)")
    launching = subprocess.Popen(  # the train task's launcher, labelling the TPU job with the run's name
        [sys.executable, "-m", "pipelines.launch_custom_job", *launcher(vertex, train, record), "--run_name", run],
        cwd=PROJECT_ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    try:
        wait_for(lambda: vertex.jobs and vertex.lines[next(iter(vertex.jobs))], seconds=COMMAND_SECONDS)
        (tpu_job,) = vertex.jobs
        assert vertex.jobs[tpu_job]["labels"]["tpu-mlm-run"] == run_label(run) != run and len(run_label(run)) == 63

        found = command(vertex, "status", run)
        assert f"  {tpu_job}  JOB_STATE_RUNNING" in found.stdout.splitlines(), found.stderr[-3000:]

        unasked = command(vertex, "cancel", run)  # no terminal to ask on, and no --yes
        assert unasked.returncode == 2 and not unasked.stdout, unasked.stderr[-3000:]
        (line,) = unasked.stderr.strip().splitlines()
        jobs = f"2 job(s): {resource(run)}, {tpu_job}"
        assert line == f"error: --yes=False: no terminal to ask on: add --yes to cancel {run} ({jobs})"
        assert vertex.cancel_requests == []

        cancelled = command(vertex, "cancel", run, "--yes", "--poll_seconds", "0.1")
        assert cancelled.returncode == 0, cancelled.stderr[-3000:]
        assert cancelled.stdout.splitlines() == [
            f"{resource(run)}: PIPELINE_STATE_CANCELLED",
            f"{tpu_job}: JOB_STATE_CANCELLED",
        ]
        assert vertex.cancel_requests == [resource(run), tpu_job]
        assert {task["state"] for task in vertex.pipeline_jobs[resource(run)]["jobDetail"]["taskDetails"]} == {
            "CANCELLED"
        }
        assert launching.wait(timeout=COMMAND_SECONDS) == 1  # its job cancelled under it: the task fails

        again = command(vertex, "cancel", run, "--yes")
        assert again.returncode == 0, again.stderr[-3000:]
        assert again.stdout.strip() == f"{run} has already ended (PIPELINE_STATE_CANCELLED): nothing to cancel"
        assert vertex.cancel_requests == [resource(run), tpu_job]  # nothing asked again
    finally:
        launching.kill()
        launching.wait()


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_logs_prints_what_the_tpu_job_printed_while_it_runs(template, vertex, tmp_path):
    run = submitted(template, tmp_path / "root")
    release = tmp_path / "release"
    lines = [f"line {number}" for number in range(1, 1_501)]  # more than a page of entries
    code = (
        f"import os, time\nprint('\\n'.join({lines!r}), flush=True)\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.05)"
    )
    record = tmp_path / "gcp_resources"
    launching = subprocess.Popen(
        [sys.executable, "-m", "pipelines.launch_custom_job", *launcher(vertex, job(code), record), "--run_name", run],
        cwd=PROJECT_ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    try:
        wait_for(lambda: vertex.jobs and len(vertex.lines[next(iter(vertex.jobs))]) == len(lines), COMMAND_SECONDS)
        every = command(vertex, "logs", run, "--logging_endpoint", vertex.url)
        assert every.returncode == 0, every.stderr[-3000:]
        assert every.stdout.splitlines() == lines
        (tpu_job,) = vertex.jobs
        same = (
            f"""gcloud logging read 'resource.type="ml_job" AND resource.labels.job_id="{tpu_job.rsplit("/", 1)[1]}"'"""
        )
        assert f"the same with gcloud: {same}" in every.stderr
        assert "gcloud logging read" in run_module("pipelines.cli", "logs", "--help", timeout=COMMAND_SECONDS).stdout

        last = command(vertex, "logs", run, "--logging_endpoint", vertex.url, "--tail", "2")
        assert last.returncode == 0, last.stderr[-3000:]
        assert last.stdout.splitlines() == ["line 1499", "line 1500"]
        release.touch()
        assert launching.wait(timeout=COMMAND_SECONDS) == 0
    finally:
        launching.kill()
        launching.wait()


# how Vertex AI says a run failed (the start of its message)
DAG_FAILED = "The DAG failed because some tasks failed. The failed tasks are: [train-step]."


@pytest.mark.parametrize(("ending", "error"), [("PIPELINE_STATE_SUCCEEDED", ""), ("PIPELINE_STATE_FAILED", DAG_FAILED)])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_status_follow_prints_each_change_until_the_run_ends(template, vertex, tmp_path, ending, error):
    run = submitted(template, tmp_path / "root")
    name = resource(run)
    changes = [
        lambda: vertex.set_task(name, "train-step", "RUNNING"),
        lambda: vertex.end_pipeline_job(name, ending, error),
    ]

    def orchestrate() -> None:  # each change once the command has looked at the run twice since the last
        for change in changes:
            seen = vertex.reads[name]
            deadline = time.monotonic() + COMMAND_SECONDS
            while vertex.reads[name] < seen + 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            change()

    threading.Thread(target=orchestrate, daemon=True).start()
    followed = command(vertex, "status", run, "--follow", "--poll_seconds", "0.1")
    lines = [line for line in followed.stdout.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    assert vertex.reads[name] > 4  # it looked again and again, and printed a line per change only
    states = [line.split(" ", 2)[1].rstrip(";") for line in lines]
    assert states == ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_RUNNING", ending], followed.stdout
    assert "train-step RUNNING" not in lines[0] and "train-step RUNNING" in lines[1]
    if ending == "PIPELINE_STATE_SUCCEEDED":  # then the run's whole status
        assert followed.returncode == 0, followed.stderr[-3000:]
        assert f"run {run}: {ending}" in followed.stdout.splitlines()
    else:
        assert followed.returncode == 1
        assert followed.stderr.strip().splitlines()[-1] == f"error: {run} ended {ending}: {error}"


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ("Not_A_Run", "must be a pipeline run's name (lowercase letters, digits and '-', as submit prints it)"),
        ("tpu-mlm-pretraining-19990101000000", f"no such pipeline run in project {PROJECT}, region {REGION}"),
    ],
    ids=["not a name", "no such run"],
)
@pytest.mark.parametrize("job_name", ["status", "logs", "cancel", "clean"])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_name_that_is_no_run_is_refused_in_one_line(vertex, job_name, run, expected):
    refused = command(vertex, job_name, run)
    assert refused.returncode == 2 and not refused.stdout
    assert refused.stderr.strip().splitlines() == [f"error: --run={run!r}: {expected}"]


@pytest.mark.parametrize("job_name", ["status", "logs", "cancel", "clean"])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_pipeline_job_of_another_pipeline_is_refused_and_left_alone(vertex, job_name, tmp_path):
    """Another team's pipeline job in the same project: not read (its checkpoint_dir names a bucket of theirs), not
    cancelled, nothing of it deleted."""
    foreign = tmp_path / "their-bucket"
    (foreign / "checkpoints").mkdir(parents=True)
    (foreign / "checkpoints" / "checkpoint").write_text("theirs")
    spec = {"pipelineInfo": {"name": "finance-etl"}, "root": {"dag": {"tasks": {"extract": {}}}}}
    config = {"gcsOutputDirectory": str(foreign), "parameterValues": {"checkpoint_dir": str(foreign / "checkpoints")}}
    vertex.create_pipeline_job(
        f"projects/{PROJECT}/locations/{REGION}", "finance-etl-nightly", {"pipelineSpec": spec, "runtimeConfig": config}
    )
    refused = command(vertex, job_name, "finance-etl-nightly", *(["--yes"] if job_name in ("cancel", "clean") else []))
    assert refused.returncode == 2 and not refused.stdout, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: --run='finance-etl-nightly': is a run of the pipeline 'finance-etl', not of tpu-mlm-pretraining: "
        "tpu-mlm reads, cancels and deletes only its own runs"
    )
    assert vertex.cancel_requests == [] and vertex.pipeline_jobs[resource("finance-etl-nightly")]["state"] == (
        "PIPELINE_STATE_RUNNING"
    )
    assert (foreign / "checkpoints" / "checkpoint").read_text() == "theirs"


def test_a_long_run_name_labels_within_the_limit_and_apart_from_its_neighbours():
    neighbour = LONG_NAME.replace("20260101120000", "20260101120001")
    assert run_label("short-run") == "short-run"
    assert len(run_label(LONG_NAME)) == len(run_label(neighbour)) == 63
    assert run_label(LONG_NAME) != run_label(neighbour) and run_label(LONG_NAME)[:40] == LONG_NAME[:40]
    # a run whose own name is 63 characters never has a long name's label
    assert all("_" not in run_label(name) for name in ("short-run", LONG_NAME[:63]))
    assert "_" in run_label(LONG_NAME)


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_submit_names_the_run_then_follows_it_to_its_end(template, vertex, gcs):
    """``submit --follow --experiment``: the run created through aiplatform (against the stand-in) in the experiment,
    its name and folders printed first, then a line at each change until it ends, then its whole status."""
    name = f"projects/{PROJECT}/locations/{REGION}/pipelineJobs/followed-run-1"

    def orchestrate() -> None:  # the run succeeds once the command has looked at it twice
        deadline = time.monotonic() + COMMAND_SECONDS
        while vertex.reads[name] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        vertex.end_pipeline_job(name, "PIPELINE_STATE_SUCCEEDED")

    threading.Thread(target=orchestrate, daemon=True).start()
    submitted_run = run_module(
        "pipelines.cli",
        *("submit", "--template", template, "--project", PROJECT, "--region", REGION),
        *("--pipeline_root", f"{gcs}/root", "--api_endpoint", vertex.url, "--run_name", "followed-run-1"),
        *("--parameters", '{"corpus": "hf:wikitext:wikitext-103-raw-v1"}', "--corpus_bytes", "546500949"),
        *("--follow", "--poll_seconds", "0.1", "--experiment", "wikitext-base"),
        timeout=COMMAND_SECONDS,
    )
    assert submitted_run.returncode == 0, submitted_run.stderr[-3000:]
    printed = submitted_run.stdout.splitlines()
    assert printed[0] == f"submitted {name}"
    assert f"checkpoints: {gcs}/root/checkpoints/followed-run-1" in printed
    assert "cancel:      tpu-mlm cancel followed-run-1 --project my-project --region us-central1" in printed
    followed = [line for line in printed if re.match(r"\d\d:\d\d:\d\d PIPELINE_STATE_", line)]
    assert followed[0].split()[1] == "PIPELINE_STATE_RUNNING;" and "PIPELINE_STATE_SUCCEEDED" in followed[-1]
    assert "run followed-run-1: PIPELINE_STATE_SUCCEEDED" in printed  # the whole status at its end
    assert "Estimate of the run on a v5e-4" in submitted_run.stderr
    # in the experiment asked for: the run's context a child of the experiment's, beside other runs there
    store = f"projects/{PROJECT}/locations/{REGION}/metadataStores/default/contexts"
    experiment = vertex.contexts[f"{store}/wikitext-base"]
    assert experiment["schemaTitle"] == "system.Experiment"
    assert experiment["childContexts"] == [f"{store}/followed-run-1"]


@pytest.mark.parametrize("limit", [0, 8])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_submit_reads_the_tpu_quota_first_and_sends_no_run_that_would_wait_for_it(template, vertex, gcs, limit):
    """A v5e-4 needs 4 chips of the region's on-demand v5e quota: read through the Cloud Quotas API (its stand-in)
    before anything is sent; none there refuses the run in one line naming the quota and where to request it, so
    that the data steps are not paid for a TPU job that would wait a day and be cancelled."""
    from quota_server import QuotaStandIn, StoredQuota

    from pipelines.quota import TPU_QUOTAS

    quota = TPU_QUOTAS["v5e", "STANDARD"]
    with QuotaStandIn(PROJECT, {quota.quota_id: StoredQuota({REGION: limit})}) as quotas:
        result = run_module(
            "pipelines.cli",
            *("submit", "--template", template, "--project", PROJECT, "--region", REGION, "--run_name", "quota-run"),
            *("--pipeline_root", f"{gcs}/root", "--api_endpoint", vertex.url, "--quota_endpoint", quotas.url),
            *("--parameters", '{"corpus": "hf:wikitext:wikitext-103-raw-v1"}', "--corpus_bytes", "546500949"),
            timeout=COMMAND_SECONDS,
        )
        # the TPU's quota first; the CPUs' (no quota of that id here: not checked) only once the TPU's is there
        assert [request.rsplit("/", 1)[1] for request in quotas.requests][:1] == [quota.quota_id]
        assert len(quotas.requests) == (2 if limit else 1)
    if limit:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "TPU quota: " in result.stderr and list(vertex.pipeline_jobs) == [resource("quota-run")]
    else:
        assert result.returncode == 2 and not vertex.pipeline_jobs
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith(f"error: --tpu-type='v5e-4': TPU quota missing: {quota.quota_id} in {REGION} is 0")
        assert "request the quota at https://console.cloud.google.com/iam-admin/quotas?project=my-project" in error


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_status_shows_the_run_where_its_training_s_files_cannot_be_read(template, vertex, tmp_path):
    """Without read access to the checkpoint folder (here: a history that cannot be read as one), status still shows
    the run, its tasks and its TPU jobs, and says what it could not read."""
    run = submitted(template, tmp_path / "root")
    folder = checkpoint_folder(str(tmp_path / "root"), run)
    Path(folder, "training_history.json").mkdir(parents=True)  # not a file
    shown = command(vertex, "status", run)
    assert shown.returncode == 0, shown.stderr[-3000:]
    (training,) = [line for line in shown.stdout.splitlines() if line.startswith("training: ")]
    assert training.startswith(f"training: {folder} not readable here (") and "tasks:" in shown.stdout


@pytest.mark.parametrize("project", ["a/b", "my-project/locations/elsewhere", "My Project"])
@pytest.mark.parametrize("job_name", ["status", "logs", "cancel"])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_project_that_is_no_project_id_is_refused_before_any_request(vertex, job_name, project):
    """The project is in every resource name a command sends: one with a '/' would name another path. Refused in
    one line as submit refuses it."""
    refused = run_module(
        "pipelines.cli",
        *(job_name, "some-run", "--project", project, "--region", REGION, "--api_endpoint", vertex.url),
        timeout=COMMAND_SECONDS,
        stdin=subprocess.DEVNULL,
    )
    assert refused.returncode == 2 and not refused.stdout
    assert refused.stderr.strip().splitlines() == [
        f"error: --project={project!r}: is not a Google Cloud project id (6-30 lowercase letters, digits and hyphens)"
    ]


@pytest.mark.parametrize(
    ("given", "requested"),
    [
        ("logging.googleapis.com", "https://logging.googleapis.com"),
        ("logging.googleapis.com:443/", "https://logging.googleapis.com:443"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
    ],
)
def test_a_logging_endpoint_without_a_scheme_is_reached_over_https(given, requested):
    """A bare host, as --api_endpoint takes one: logs requests it over https:// (requests itself takes no URL
    without a scheme), and a trailing '/' makes no '//' in the path."""
    from pipelines.runs import LogsArguments

    assert LogsArguments(run="some-run", project=PROJECT, logging_endpoint=given).logging_endpoint == requested


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_command_that_cannot_reach_vertex_ai_says_so_in_seconds_not_after_a_run_s_ten_minutes():
    """A wrong endpoint or no network: the first call is retried for FIRST_CALL_RETRY_SECONDS, not the
    CALL_RETRY_SECONDS a run's later calls (and the launcher's) wait out a transient outage."""
    import socket

    from pipelines.vertex_jobs import CALL_RETRY_SECONDS, FIRST_CALL_RETRY_SECONDS

    with socket.socket() as closed:  # a port nothing listens on once it is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    where = ("--project", PROJECT, "--region", REGION, "--api_endpoint", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    unreached = run_module("pipelines.cli", "status", "some-run", *where, timeout=COMMAND_SECONDS + CALL_RETRY_SECONDS)
    seconds = time.monotonic() - started
    assert unreached.returncode == 1 and not unreached.stdout
    assert (
        unreached.stderr.strip()
        .splitlines()[-1]
        .startswith("error: Google Cloud could not be reached (ConnectionError): Timeout of 30.0s exceeded")
    )
    assert seconds < FIRST_CALL_RETRY_SECONDS + COMMAND_SECONDS < CALL_RETRY_SECONDS


def test_a_run_s_first_call_is_retried_briefly_and_the_calls_after_an_answer_as_long_as_a_run_s(monkeypatch):
    """What the closed-port test above times, for every command: status, logs and cancel's first call, and a run
    submit has just created (Vertex AI answered it), followed from its first call at the long deadline."""
    from types import SimpleNamespace

    from pipelines import runs
    from pipelines.vertex_jobs import CALL_RETRY_SECONDS, FIRST_CALL_RETRY_SECONDS

    ours = SimpleNamespace(pipeline_spec={"pipelineInfo": {"name": runs.PIPELINE_NAME}})
    deadlines = []

    def answered(method, retry_seconds, **request):
        deadlines.append(retry_seconds)
        return ours

    monkeypatch.setattr(runs, "call", answered)
    for client in ("pipeline_client", "job_client"):  # no client is reached: `call` answers
        monkeypatch.setattr(runs, client, lambda region, endpoint: SimpleNamespace(get_pipeline_job=None))
    arguments = runs.StatusArguments(run="a-run", project=PROJECT, region=REGION)
    run = runs.Run(arguments, "")
    assert run.pipeline_job() is ours and run.pipeline_job() is ours
    assert deadlines == [FIRST_CALL_RETRY_SECONDS, CALL_RETRY_SECONDS]
    runs.Run(arguments, "", reached=True).pipeline_job()
    assert deadlines[-1] == CALL_RETRY_SECONDS
