"""The pipeline's TPU task launcher against the Vertex AI stand-in: a retry creates a new job where the one the task
recorded ended without success, follows one still running, and a cancelled task cancels its job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import PROJECT_ROOT, run_module
from google.cloud.aiplatform_v1 import Scheduling
from vertex_server import VertexStandIn

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
    scheduling = {"timeout": "7200s", "strategy": "SPOT", "restart_job_on_worker_restart": True}
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


def earlier_job(vertex: VertexStandIn, command: str, record) -> str:
    """A job of the task's earlier attempt, recorded in ``record`` as GCPC's launcher records it."""
    pool = {"containerSpec": {"command": ["python", "-c", command]}}
    name = vertex.create(PARENT, {"jobSpec": {"workerPoolSpecs": [pool]}})["name"]
    resource = {"resourceType": "CustomJob", "resourceUri": f"{vertex.url}/v1/{name}"}
    record.write_text(json.dumps({"resources": [resource]}))
    return name


def wait_for(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize("earlier", ["failed", "cancelled", "none"])
def test_a_retry_creates_a_new_job_unless_the_recorded_one_can_still_succeed(tmp_path, earlier):
    record = tmp_path / "outputs" / "gcp_resources"
    record.parent.mkdir()
    with VertexStandIn() as vertex:
        if earlier != "none":
            command = "raise SystemExit(3)" if earlier == "failed" else "import time; time.sleep(600)"
            old = earlier_job(vertex, command, record)
            if earlier == "cancelled":
                vertex.cancel(old)
            wait_for(lambda: vertex.get(old)["state"] != "JOB_STATE_RUNNING")
        result = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('trained')"), record))
        names = list(vertex.jobs)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(names) == (1 if earlier == "none" else 2)
    assert recorded(record) == names[-1] and vertex.jobs[names[-1]]["state"] == "JOB_STATE_SUCCEEDED"
    assert vertex.logs[names[-1]].strip() == "trained"
    if earlier != "none":
        ended = "JOB_STATE_FAILED" if earlier == "failed" else "JOB_STATE_CANCELLED"
        assert f"the job this task recorded, {names[0]}, ended {ended}: this retry creates a new one" in result.stderr
    # what Vertex AI got: the payload's job, its empty fields left out
    created = vertex.jobs[names[-1]]["jobSpec"]
    assert created["workerPoolSpecs"][0]["machineSpec"] == {"machineType": "ct5lp-hightpu-4t", "tpuTopology": "2x2"}
    scheduling = Scheduling.from_json(json.dumps(created["scheduling"]))
    assert (scheduling.timeout.total_seconds(), scheduling.strategy) == (7200, Scheduling.Strategy.SPOT)
    assert scheduling.restart_job_on_worker_restart


def test_a_retry_follows_the_recorded_job_while_it_runs_and_reports_its_failure(tmp_path):
    record = tmp_path / "gcp_resources"
    with VertexStandIn() as vertex:
        running = earlier_job(vertex, "import time; time.sleep(3)", record)
        followed = run_module("pipelines.launch_custom_job", *launcher(vertex, job("print('new')"), record))
        assert followed.returncode == 0, followed.stderr[-3000:]
        assert list(vertex.jobs) == [running] and vertex.jobs[running]["state"] == "JOB_STATE_SUCCEEDED"
        assert f"following the job this task recorded, {running} (JOB_STATE_RUNNING)" in followed.stderr

        record.unlink()
        failing = run_module("pipelines.launch_custom_job", *launcher(vertex, job("raise SystemExit(3)"), record))
        (_, failed) = vertex.jobs
    assert failing.returncode == 1 and "Traceback" not in failing.stderr
    assert failing.stderr.strip().splitlines()[-1] == (
        f"error: {failed} ended JOB_STATE_FAILED: The replica workerpool0-0 exited with a non-zero status of 3."
    )


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
