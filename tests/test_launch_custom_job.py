"""The pipeline's TPU task launcher against the Vertex AI stand-in: a retry creates a new job where the one the task
recorded failed for a reason another try may not meet, with what is left of the time limit, and not where it was
cancelled or failed for good; it follows one still running, and a cancelled task cancels its job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import PROJECT_ROOT, compiled_step_command, filled_step_command, run_module
from google.cloud.aiplatform_v1 import Scheduling
from vertex_server import VertexStandIn

pytestmark = pytest.mark.slow  # each runs the launcher and its jobs in processes of their own

PARENT = "projects/my-project/locations/us-central1"


def job(command: str) -> dict:
    """A custom job as GCPC's compiled payload has it (numbers as floats, empty fields), running ``command``."""
    machine = {"machine_type": "ct5lp-hightpu-4t", "tpu_topology": "2x2", "accelerator_type": ""}
    pool = {
        "machine_spec": {**machine, "accelerator_count": 0},
        "replica_count": 1.0,
        "container_spec": {"image_uri": "us-docker.pkg.dev/p/r/tpu:1", "command": ["python", "-c", command], "env": []},
        "disk_spec": {},
    }
    # GCPC's component compiles a max_wait_duration of a day, which the API takes with FLEX_START only
    scheduling = {
        "timeout": "7200s",
        "strategy": "SPOT",
        "restart_job_on_worker_restart": True,
        "max_wait_duration": "86400s",
    }
    return {"display_name": "train", "job_spec": {"worker_pool_specs": [pool], "scheduling": scheduling}}


def launcher(vertex: VertexStandIn, payload: dict, record) -> list[str]:
    return [
        *("--type", "CustomJob", "--project", "my-project", "--location", "us-central1"),
        *("--payload", json.dumps(payload), "--gcp_resources", str(record)),
        *("--api_endpoint", vertex.url, "--poll_seconds", "0.1"),
    ]


def recorded(record) -> str:
    (resource,) = json.loads(record.read_text())["resources"]
    assert resource["resourceType"] == "CustomJob"
    return resource["resourceUri"].split("/v1/", 1)[1]


def earlier_job(
    vertex: VertexStandIn, command: str | list[str], record, labels: dict | None = None, env: dict | None = None
) -> str:
    """A job of the task's earlier attempt, recorded in ``record`` as GCPC's launcher records it; ``command``: Python
    code, or a container's whole command; ``env``: its container's environment."""
    pool = {"containerSpec": {"command": ["python", "-c", command] if isinstance(command, str) else command}}
    pool["containerSpec"]["env"] = [{"name": name, "value": value} for name, value in (env or {}).items()]
    name = vertex.create(PARENT, {"jobSpec": {"workerPoolSpecs": [pool]}, "labels": labels or {}})["name"]
    resource = {"resourceType": "CustomJob", "resourceUri": f"{vertex.url}/v1/{name}"}
    record.write_text(json.dumps({"resources": [resource]}))
    return name


def wait_for(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.1)


def running_until_read(vertex: VertexStandIn, tmp_path) -> tuple[str, Callable[[str], None]]:
    """A job's Python code that runs until it is released, and the release: a thread that lets the job ``name`` end
    once it has been read through the API (by the launcher under test, which saw it running), whatever the machine's
    speed."""
    release = tmp_path / "release"
    code = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"

    def release_after_reads(name: str) -> None:
        def wait() -> None:  # no assertion here: a thread's failure is no test's; the test checks what it needs
            deadline = time.monotonic() + 120
            while vertex.reads[name] < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            release.touch()  # read, or long past the test: the job ends either way

        threading.Thread(target=wait, daemon=True).start()

    return code, release_after_reads


def seconds_ran(job: dict) -> int:
    from datetime import datetime

    start, end = (datetime.fromisoformat(job[key].replace("Z", "+00:00")) for key in ("startTime", "endTime"))
    return int((end - start).total_seconds())


@pytest.mark.parametrize("earlier", ["failed", "none"])
def test_a_retry_replaces_a_failed_job_with_what_is_left_of_the_time_limit(tmp_path, monkeypatch, earlier):
    record = tmp_path / "outputs" / "gcp_resources"
    record.parent.mkdir()
    run_labels = {"vertex-ai-pipelines-run-billing-id": "1234", "tpu-mlm-seconds-used": "not the system's to set"}
    monkeypatch.setenv("VERTEX_AI_PIPELINES_RUN_LABELS", json.dumps(run_labels))
    with VertexStandIn() as vertex:
        if earlier == "failed":  # a second retry: the job before it had already run 5,000 s of the 7,200
            old = earlier_job(vertex, "raise SystemExit(1)", record, {"tpu-mlm-seconds-used": "5000"})
            # the train step crashed (status 1: not bad input, a refusal or a divergence): another job may get further
            wait_for(lambda: vertex.get(old)["state"] == "JOB_STATE_FAILED")
        result = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('trained')"), record))
        names = list(vertex.jobs)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(names) == (1 if earlier == "none" else 2)
    assert recorded(record) == names[-1] and vertex.jobs[names[-1]]["state"] == "JOB_STATE_SUCCEEDED"
    assert vertex.logs[names[-1]].strip() == "trained"
    created = vertex.jobs[names[-1]]
    used = 0 if earlier == "none" else 5000 + seconds_ran(vertex.jobs[names[0]])
    if earlier == "failed":
        assert f"this task's earlier job, {names[0]} ended JOB_STATE_FAILED (3: The replica" in result.stderr
    # what Vertex AI got: the payload's job, its empty fields and max_wait_duration left out, the time left, the
    # run's labels (billing) beside the seconds used so far
    assert created["jobSpec"]["workerPoolSpecs"][0]["machineSpec"] == {
        "machineType": "ct5lp-hightpu-4t",
        "tpuTopology": "2x2",
    }
    scheduling = Scheduling.from_json(json.dumps(created["jobSpec"]["scheduling"]))
    assert (scheduling.timeout.total_seconds(), scheduling.strategy) == (7200 - used, Scheduling.Strategy.SPOT)
    assert scheduling.restart_job_on_worker_restart and not scheduling.max_wait_duration
    assert created["labels"] == {"vertex-ai-pipelines-run-billing-id": "1234", "tpu-mlm-seconds-used": str(used)}


def compiled_train_job(tmp_path, shards: dict, parameters: dict, tpu_type: str = "v3-8") -> list[str]:
    """The compiled pipeline's TPU job command for the train step, with the executor input Vertex AI would fill in."""
    from pipelines.pipeline import compile_pipeline

    compiled = compile_pipeline(str(tmp_path / "pipeline.yaml"), target="vertex", tpu_type=tpu_type)
    spec = yaml.safe_load(Path(compiled).read_text())
    artifacts = {
        "tokenizer": ("system.Artifact", shards["tokenizer"]),
        "train_shards": ("system.Dataset", shards["train"]),
        "eval_shards": ("system.Dataset", shards["validation"]),
        "model": ("system.Model", str(tmp_path / "model")),
    }
    parameters = {"checkpoint_dir": str(tmp_path / "checkpoints"), **parameters}
    return filled_step_command(compiled_step_command(spec, "train-step"), tmp_path, parameters, artifacts)


@pytest.mark.parametrize(
    "ending", ["cancelled", "failed for good", "exited refusing its input", "time spent", "too little left"]
)
def test_a_retry_does_not_replace_a_job_that_would_stop_or_fail_the_same_way(tmp_path, ending):
    record = tmp_path / "gcp_resources"
    with VertexStandIn() as vertex:
        spent = {"time spent": "7200", "too little left": "6000"}  # of the 7,200 s limit: 20 min left, 30 wanted
        labels = {"tpu-mlm-seconds-used": spent[ending]} if ending in spent else {}
        command = "import time; time.sleep(600)" if ending == "cancelled" else "raise SystemExit(1)"
        if ending == "exited refusing its input":  # an image that writes no verdict: its status is the job's
            command = "raise SystemExit(2)"
        old = earlier_job(vertex, command, record, labels)
        if ending == "cancelled":  # someone stopped it, in the console, to stop paying
            vertex.cancel(old)
        wait_for(lambda: vertex.get(old)["state"] != "JOB_STATE_RUNNING")
        if ending == "failed for good":
            vertex.jobs[old]["error"] = {"code": 7, "message": "Permission denied on the image"}
        start_and_margin = ["--min_minutes_left", "30"]
        arguments = launcher(vertex, job("print('trained')"), record)
        result = run_module("pipelines.launch_custom_job", *arguments, *start_and_margin)
        assert list(vertex.jobs) == [old]  # no new TPU job
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    if ending == "too little left":
        assert last.startswith("error: 20 min are left of the run's TPU time limit (2 h), less than a new job needs")
    elif ending == "time spent":
        assert last == (
            "error: the run's TPU time limit (2 h) is spent by this task's earlier jobs: no new job (raise "
            "tpu_job_timeout_hours to train on)"
        )
    else:
        state, code = {
            "cancelled": ("JOB_STATE_CANCELLED", "0: no error given"),
            "failed for good": ("JOB_STATE_FAILED", "7: Permission denied"),
            "exited refusing its input": (
                "JOB_STATE_FAILED",
                "3: The replica workerpool0-0 exited with a non-zero status of 2",
            ),
        }[ending]
        assert last.startswith(f"error: {old} ended {state} ({code}")
        assert last.endswith("not replaced, as another job would stop or fail the same way")


def test_a_retry_follows_the_recorded_job_while_it_runs_and_reports_its_failure(tmp_path):
    record = tmp_path / "gcp_resources"
    with VertexStandIn() as vertex:
        code, release_after_reads = running_until_read(vertex, tmp_path)
        running = earlier_job(vertex, code, record)
        release_after_reads(running)
        followed = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('new')"), record))
        assert followed.returncode == 0, followed.stderr[-3000:]
        assert list(vertex.jobs) == [running] and vertex.jobs[running]["state"] == "JOB_STATE_SUCCEEDED"
        assert f"following this task's earlier job, {running} (JOB_STATE_RUNNING)" in followed.stderr

        record.unlink()
        failing = run_module("pipelines.launch_custom_job", *launcher(vertex, job("raise SystemExit(1)"), record))
        (_, failed) = vertex.jobs
    assert failing.returncode == 1 and "Traceback" not in failing.stderr
    assert failing.stderr.strip().splitlines()[-1] == (
        f"error: {failed} ended JOB_STATE_FAILED: The replica workerpool0-0 exited with a non-zero status of 1."
    )


RUN = "vertex-ai-pipelines-run-billing-id"


def test_a_retry_without_its_record_keeps_the_rules_for_the_run_s_ended_job(tmp_path, monkeypatch):
    """The run's latest train job, found by its label, is judged as a recorded one: cancelled, it is not replaced."""
    monkeypatch.setenv("VERTEX_AI_PIPELINES_RUN_LABELS", json.dumps({RUN: "run-7"}))
    pool = {"containerSpec": {"command": ["python", "-c", "import time; time.sleep(600)"]}}
    with VertexStandIn() as vertex:
        cancelled = vertex.create(
            PARENT, {"displayName": "train", "jobSpec": {"workerPoolSpecs": [pool]}, "labels": {RUN: "run-7"}}
        )["name"]
        vertex.cancel(cancelled)  # someone stopped the run's TPU job to stop paying
        record = tmp_path / "gcp_resources"
        result = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('again')"), record))
        assert list(vertex.jobs) == [cancelled]
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {cancelled} ended JOB_STATE_CANCELLED")


@pytest.mark.parametrize("filters", [True, False])
def test_a_retry_without_its_record_follows_the_run_s_live_job_instead_of_starting_a_second(
    tmp_path, monkeypatch, filters
):
    """Whether Vertex AI hands a retried task its predecessor's gcp_resources is not documented: where it does not,
    a job of this task in this run that has not ended (its launcher lost) is found by the run's label."""
    monkeypatch.setenv("VERTEX_AI_PIPELINES_RUN_LABELS", json.dumps({RUN: "run-7"}))
    with VertexStandIn(filters=filters) as vertex:  # a service that refuses the filter: a new job, as before
        code, release_after_reads = running_until_read(vertex, tmp_path)
        pool = {"containerSpec": {"command": ["python", "-c", code]}}
        names = [
            vertex.create(
                PARENT, {"displayName": "train", "jobSpec": {"workerPoolSpecs": [pool]}, "labels": {RUN: run}}
            )["name"]
            for run in ("run-8", "run-7")  # another run's job, then this run's
        ]
        release_after_reads(names[1])
        record = tmp_path / "gcp_resources"  # none: a fresh output for the retried task
        result = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('second')"), record))
        jobs = list(vertex.jobs)
    assert result.returncode == 0, result.stderr[-3000:]
    if not filters:
        assert "could not look for this run's earlier jobs (400 " in result.stderr
        assert len(jobs) == 3 and recorded(record) == jobs[2]
        return
    assert jobs == names  # no second TPU job for this run
    assert f"following this task's earlier job, {names[1]} (JOB_STATE_RUNNING)" in result.stderr
    assert recorded(record) == names[1] and vertex.jobs[names[1]]["state"] == "JOB_STATE_SUCCEEDED"


def test_a_cancelled_task_cancels_its_job(tmp_path):
    record = tmp_path / "gcp_resources"
    with VertexStandIn() as vertex:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipelines.launch_custom_job",
                *launcher(vertex, job("import time; time.sleep(600)"), record),
            ],
            cwd=PROJECT_ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        )
        wait_for(lambda: record.exists() and vertex.jobs)
        process.send_signal(signal.SIGTERM)  # how Vertex AI stops a task of a cancelled pipeline run
        assert process.wait(timeout=120) == 1
        (name,) = vertex.jobs
    assert vertex.cancel_requests == [name] and vertex.jobs[name]["state"] == "JOB_STATE_CANCELLED"
    assert process.stderr.read().strip().splitlines()[-1] == f"error: stopped by SIGTERM: {name} is JOB_STATE_CANCELLED"


@pytest.mark.parametrize("limit_from", ["payload", "flag"])
def test_a_job_queued_past_the_limit_is_cancelled_and_a_paused_one_is_not_replaced(tmp_path, limit_from):
    """The limit is the payload's max_wait_duration (the pipeline's tpu_max_queued_hours; not sent to the API,
    which takes it for FLEX_START only), else --max_queued_minutes."""
    payload = job("print('trained')")
    if limit_from == "payload":
        payload["job_spec"]["scheduling"]["max_wait_duration"] = "1.2s"
        flag = ()
    else:
        del payload["job_spec"]["scheduling"]["max_wait_duration"]
        flag = ("--max_queued_minutes", "0.02")
    with VertexStandIn(start_jobs=False) as vertex:  # no TPU capacity or quota: the job never starts
        record = tmp_path / "queued"
        queued = run_module("pipelines.launch_custom_job", *launcher(vertex, payload, record), *flag, timeout=120)
        (name,) = vertex.jobs
        assert vertex.cancel_requests == [name] and vertex.jobs[name]["state"] == "JOB_STATE_CANCELLED"
    assert queued.returncode == 1 and "Traceback" not in queued.stderr, queued.stderr[-3000:]
    assert (
        queued.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: {name} stayed queued or pending for more than 0.02 min and was cancelled (JOB_STATE_CANCELLED)"
        )
    )

    with VertexStandIn() as vertex:
        record = tmp_path / "paused"
        paused = earlier_job(vertex, "import time; time.sleep(600)", record)
        vertex.jobs[paused]["state"] = "JOB_STATE_PAUSED"
        result = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('trained')"), record))
        assert list(vertex.jobs) == [paused]
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {paused} ended JOB_STATE_PAUSED")


def test_a_job_attached_to_a_tensorboard_writes_its_logs_in_the_run_s_own_folder(tmp_path):
    """With a Vertex AI TensorBoard named, the job gets the run's TensorBoard folder as its output folder, so that
    Vertex AI's AIP_TENSORBOARD_LOG_DIR (what the train step writes to, and what is uploaded) is the run's alone."""
    payload = job("import os; print(os.environ['AIP_TENSORBOARD_LOG_DIR'])")
    payload["job_spec"]["tensorboard"] = "projects/my-project/locations/us-central1/tensorboards/123"
    payload["job_spec"]["base_output_directory"] = {"output_uri_prefix": ""}  # as GCPC compiles it: empty
    run = ("--run_name", "wikitext-base-1", "--pipeline_root", "gs://bucket/root")
    with VertexStandIn() as vertex:
        record = tmp_path / "attached"
        launched = run_module("pipelines.launch_custom_job", *launcher(vertex, payload, record), *run, timeout=120)
        assert launched.returncode == 0, launched.stderr[-3000:]
        (name,) = vertex.jobs
        spec = vertex.jobs[name]["jobSpec"]
        assert spec["tensorboard"] == "projects/my-project/locations/us-central1/tensorboards/123"
        assert spec["baseOutputDirectory"]["outputUriPrefix"] == "gs://bucket/root/tensorboard/wikitext-base-1"
        assert vertex.logs[name].strip() == "gs://bucket/root/tensorboard/wikitext-base-1/logs/"
        # without the run's name there is no folder of its own to give: refused before any job is created
        unnamed = run_module(
            "pipelines.launch_custom_job",
            *launcher(vertex, payload, tmp_path / "unnamed"),
            "--pipeline_root",
            "gs://bucket/root",
            timeout=120,
        )
        assert list(vertex.jobs) == [name]
    assert unnamed.returncode == 2
    assert (
        unnamed.stderr.strip().splitlines()[-1].startswith("error: --pipeline-root='gs://bucket/root': a job attached")
    )


@pytest.mark.parametrize("outcome", ["refused input", "slice not up"])
def test_an_outcome_the_step_knows_costs_one_tpu_start_and_ends_the_task_with_its_status_and_line(
    tmp_path, monkeypatch, embedded_shards, outcome
):
    """The compiled train step's TPU job, created by the launcher on the stand-in, which restarts a worker that exits
    non-zero as Vertex AI documents. On a v3-8 (no TPU here) the step refuses its input (2); on a v5e-16 whose hosts
    nothing names (no TPU_WORKER_* variables, a metadata server without the slice's attributes, Vertex AI's
    CLUSTER_SPEC of one worker) the slice launcher finds none (3). Each writes its verdict and ends the job cleanly
    after one start: the task exits with the status and the step's own line, and its retry creates no job."""
    from test_slice import MetadataStandIn

    metadata = MetadataStandIn({})  # a VM's metadata server, without a slice's attributes
    monkeypatch.setenv("GCE_METADATA_HOST", metadata.host)
    tpu_type, status = ("v3-8", 2) if outcome == "refused input" else ("v5e-16", 3)
    command = compiled_train_job(tmp_path, embedded_shards, {"accelerator": "tpu", "replicas": 8}, tpu_type)
    pool = {"machine_spec": {"machine_type": "cloud-tpu"}, "replica_count": 1, "container_spec": {"command": command}}
    payload = {"display_name": "train", "job_spec": {"worker_pool_specs": [pool]}}
    record = tmp_path / "gcp_resources"
    with VertexStandIn() as vertex:
        first = run_module("pipelines.launch_custom_job", *launcher(vertex, payload, record), timeout=300)
        (name,) = vertex.jobs
        retried = run_module("pipelines.launch_custom_job", *launcher(vertex, payload, record), timeout=300)
        assert list(vertex.jobs) == [name]  # no second TPU job
    metadata.shutdown()
    assert vertex.starts[name] == 1 and vertex.jobs[name]["state"] == "JOB_STATE_SUCCEEDED", vertex.logs[name][-3000:]
    line = vertex.logs[name].strip().splitlines()[-1]
    expected = {
        "refused input": "error: --accelerator='tpu': no TPU found at --tpu='local' (this machine has no TPU device",
        "slice not up": "error: found no TPU slice hosts: TPU_WORKER_ID and TPU_WORKER_HOSTNAMES are not set",
    }[outcome]
    assert line.startswith(expected)
    for task in (first, retried):
        assert task.returncode == status and "Traceback" not in task.stderr, task.stderr[-3000:]
        assert task.stderr.strip().splitlines()[-1] == line
    (verdict,) = (tmp_path / "verdicts").iterdir()
    assert json.loads(verdict.read_text())["status"] == status


def test_a_crash_is_restarted_as_vertex_ai_documents_then_replaced_by_the_task_s_retry(tmp_path):
    """A worker that crashes (an unknown failure, status 1) is what Vertex AI's restarts are for: 5 restarts in the
    same VM, then 3 retries of the job, 24 starts in all before the job fails; the task fails, and its retry
    creates one new job (which resumes from the run's checkpoints)."""
    record = tmp_path / "gcp_resources"
    crash = job("raise SystemExit(1)")
    with VertexStandIn() as vertex:
        first = run_module("pipelines.launch_custom_job", *launcher(vertex, crash, record), timeout=300)
        retried = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('trained')"), record))
        crashed, replacement = vertex.jobs
    assert vertex.starts[crashed] == (5 + 1) * (3 + 1) and vertex.jobs[crashed]["state"] == "JOB_STATE_FAILED"
    assert first.returncode == 1 and first.stderr.strip().splitlines()[-1] == (
        f"error: {crashed} ended JOB_STATE_FAILED: The replica workerpool0-0 exited with a non-zero status of 1."
    )
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert vertex.starts[replacement] == 1 and recorded(record) == replacement


def test_the_stand_in_s_running_jobs_end_with_it_and_start_no_worker_again(tmp_path):
    """A test that leaves a job running (a cancel that does not take, a job that sleeps) must not leave its worker
    restarted for minutes in the test process after the stand-in is gone."""
    with VertexStandIn() as vertex:
        name = earlier_job(vertex, "import time; time.sleep(600)", tmp_path / "record")
        wait_for(lambda: name in vertex.processes)
    assert not vertex._supervisors[name].is_alive()
    assert vertex.starts[name] == 1 and vertex.processes[name].returncode is not None
    assert vertex.jobs[name]["state"] == "JOB_STATE_CANCELLED"


@pytest.mark.parametrize("model", ["saved", "missing"])
def test_a_job_that_succeeded_with_no_verdict_succeeds_only_with_its_model(tmp_path, model):
    """A train job that ends 0 having written no verdict (an image from before verdicts, or a step that exited early
    without a word): the task succeeds where the model was saved (its summary, written last, is there), and fails in
    one line, never as a success, where it was not."""
    outputs = {"artifacts": {"model": {"artifacts": [{"name": "model", "uri": str(tmp_path / "model")}]}}}
    executor_input = {"inputs": {"parameterValues": {"output_root": ""}}, "outputs": outputs}
    if model == "saved":
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "training_summary.json").write_text("{}")
    payload = job("print('ended')")
    payload["job_spec"]["worker_pool_specs"][0]["container_spec"]["args"] = [
        "--executor_input",
        json.dumps(executor_input),
    ]
    with VertexStandIn() as vertex:
        result = run_module("pipelines.launch_custom_job", *launcher(vertex, payload, tmp_path / "record"))
        (name,) = vertex.jobs
    env = vertex.jobs[name]["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"]
    (given,) = [variable["value"] for variable in env if variable["name"] == "TPU_MLM_VERDICT"]
    assert given.startswith(str(tmp_path / "verdicts") + "/")  # the job's own file, in the task's folder
    if model == "saved":
        assert result.returncode == 0, result.stderr[-3000:]
        return
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        f"error: {name} ended JOB_STATE_SUCCEEDED with no verdict and no model ({tmp_path / 'model'}): the train "
        "step did not run to its end (its log says why: tpu-mlm logs RUN)"
    )


def test_a_first_run_s_rehearsed_preemption_is_restarted_by_vertex_ai_and_resumes_from_its_checkpoint(
    tmp_path, embedded_shards
):
    """``rehearse_restart`` (what ``submit --first_run`` sets): the compiled train step, in the launcher's job on the
    stand-in, exits as a preempted job does at its first checkpoint; Vertex AI's restart of the worker, in the same
    job, restores that checkpoint and trains to the end; the verdict, which the task prints, says so."""
    tiny = {"model_config": "tiny", "per_replica_batch_size": 8, "accelerator": "cpu", "replicas": 0, "max_steps": 20}
    pace = {"steps_per_execution": 5, "log_every_steps": 5, "checkpoint_every_steps": 10, "eval_batches": 1}
    command = compiled_train_job(tmp_path, embedded_shards, {**tiny, **pace, "rehearse_restart": True})
    pool = {"machine_spec": {"machine_type": "cloud-tpu"}, "replica_count": 1, "container_spec": {"command": command}}
    payload = {"display_name": "train", "job_spec": {"worker_pool_specs": [pool]}}
    with VertexStandIn() as vertex:
        arguments = [*launcher(vertex, payload, tmp_path / "record"), "--run_name", "first-run"]
        result = run_module("pipelines.launch_custom_job", *arguments, timeout=600)
        (name,) = vertex.jobs
    assert result.returncode == 0, result.stderr[-3000:] + vertex.logs[name][-3000:]
    assert vertex.starts[name] == 2 and vertex.jobs[name]["state"] == "JOB_STATE_SUCCEEDED"
    assert "rehearsing a preemption (--rehearse_restart)" in vertex.logs[name]
    assert "verdict: trained to step 20, resumed from the checkpoint of step 10" in result.stdout
    summary = json.loads((tmp_path / "model" / "training_summary.json").read_text())
    assert summary["resumed_from_step"] == 10 and summary["total_steps"] == 20
    attempts = json.loads((tmp_path / "checkpoints" / "attempts.json").read_text())
    assert [(attempt["step"], attempt["outcome"]) for attempt in attempts] == [(0, "stopped"), (10, "done")]
    # each names the run, as the launcher tells its job: clean reads who trained in a checkpoint folder
    run = "projects/my-project/locations/us-central1/pipelineJobs/first-run"
    assert {attempt["run"] for attempt in attempts} == {run}


def test_a_tpu_that_did_not_start_ends_its_job_after_one_start_and_the_task_s_next_try_creates_a_new_job(
    tmp_path, embedded_shards
):
    """The train step whose TPU worker is not answering yet (TensorFlow's UnavailableError where it connects: what a
    new job on another VM may not meet), in a job given a verdict file as the launcher gives one: the step's
    verdict (1) ends the job after one start rather than Vertex AI's restarts on the same VM; the task following
    that job fails with the step's line, and its next try creates a new job."""
    record, file = tmp_path / "gcp_resources", tmp_path / "verdicts" / "first.json"
    unavailable = ["--function", "tensorflow:config.experimental_connect_to_cluster", "--action", "unavailable"]
    data = ["--tokenizer", embedded_shards["tokenizer"], "--train_shards", embedded_shards["train"]]
    tpu = ["--accelerator", "tpu", "--tpu", "grpc://127.0.0.1:9", "--model_config", "tiny", "--max_steps", "10"]
    step = ["components.train", *data, *tpu, "--output", str(tmp_path / "model")]
    with VertexStandIn() as vertex:
        code, release_after_reads = running_until_read(vertex, tmp_path)
        # held until the launcher has seen it running, then the step as its container would run it
        then_run = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        command = ["python", "-c", f"{code}\n{then_run}", "tests/kill_at.py", *unavailable, "--", *step]
        first = earlier_job(vertex, command, record, env={"TPU_MLM_VERDICT": str(file)})
        release_after_reads(first)
        followed = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('new')"), record))
        retried = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('trained')"), record))
        names = list(vertex.jobs)
    assert vertex.starts[first] == 1 and vertex.jobs[first]["state"] == "JOB_STATE_SUCCEEDED", vertex.logs[first]
    line = vertex.logs[first].strip().splitlines()[-1]
    assert line.startswith("error: the TPU at --tpu='grpc://127.0.0.1:9' did not start with ")
    assert json.loads(file.read_text())["status"] == 1
    assert followed.returncode == 1 and followed.stderr.strip().splitlines()[-1] == (
        f"{line} ({first}; the task's next try creates a new job)"
    )
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert len(names) == 2 and recorded(record) == names[1] and vertex.starts[names[1]] == 1
    assert f"{first}'s accelerator did not start" in retried.stderr
