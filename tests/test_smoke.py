"""The smoke test before a first TPU run: its in-job script at 2 CPU replicas through a bucket, its job as Vertex
AI's API types read it, and ``tpu-mlm smoke`` creating, following and reading a job on a stand-in of Vertex AI's
job service."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PROJECT_ROOT, run_module
from transformers import HfArgumentParser

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.job_runner import REFUSED_EXIT
from components.lib.shard_set import read_manifest
from pipelines import submit_smoke
from pipelines.smoke_job import SmokeArguments, smoke

pytestmark = pytest.mark.slow


def test_the_smoke_script_trains_two_cpu_replicas_on_data_it_makes_and_passes(gcs):
    # in the bucket, as the job on Vertex AI writes, with the README's object roles only (see gcs_routing)
    scratch = f"{gcs}/smoke"
    result = run_module(
        "pipelines.smoke_job",
        *("--scratch", scratch, "--accelerator", "cpu", "--replicas", "2", "--model_config", "mini"),
        *("--per_replica_batch_size", "8", "--steps", "6", "--vocab_size", "8000", "--max_length", "32"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verdict: PASS" in result.stderr
    report = json.loads(storage.read_text(f"{scratch}/smoke.json"))
    assert report["verdict"] == "pass" and report["problems"] == []
    trained = report["stages"]["train"]
    assert (trained["accelerator"], trained["replicas"], trained["global_batch_size"]) == ("cpu", 2, 16)
    assert 0 <= trained["compile_seconds"] < trained["first_call_seconds"]
    assert trained["samples_per_second"] == pytest.approx(16 / trained["step_seconds"])
    # the embedded corpus gives about 6,000 pieces: the tokenizer is padded to the run's vocabulary, and so is the model
    assert len(json.loads(storage.read_text(f"{scratch}/tokenizer/tokenizer.json"))["added_tokens"]) > 1000
    assert json.loads(storage.read_text(f"{scratch}/model/config.json"))["vocab_size"] == 8000
    manifest = json.loads(storage.read_text(f"{scratch}/shards/train/manifest.json"))
    assert manifest["num_records"] >= 2 * 16
    memory = report["stages"]["memory"]
    # TensorFlow's CPU allocator keeps a count on some machines and not on others: either way it is reported
    peak = memory["peak_gib_per_replica"]
    assert (peak is None and memory["why_not"]) or (peak >= 0 and "why_not" not in memory), memory
    assert 0 < memory["estimate_low_gib"] <= memory["estimate_high_gib"]
    assert report["stages"]["storage"]["read_back"] is True
    assert report["warnings"] == []  # a CPU without a memory count is no warning
    # the validation ran at the final checkpoint, on shards of its own
    assert json.loads(storage.read_text(f"{scratch}/shards/validation/manifest.json"))["split"] == "validation"
    assert "validation loss" in result.stderr


def probe(tmp_path, shards: dict, steps: int = 60, batch: int = 16, **settings) -> dict:
    """The smoke test and its peak probe of ``steps`` at a batch of ``batch`` on the run's own shards, on the CPU;
    returns the report."""
    arguments = SmokeArguments(
        scratch=str(tmp_path / "smoke"),
        accelerator="cpu",
        model_config="tiny",
        per_replica_batch_size=batch,
        steps=3,
        train_shards=shards["train"],
        tokenizer=shards["tokenizer"],
        peak_probe_steps=steps,
        bf16=False,  # in this process: bf16 would be the process's Keras policy after it (the CPU's float32 here)
        exit_zero=True,
        **settings,
    )
    return smoke(arguments)


def test_the_peak_probe_reaches_the_recipe_s_peak_on_the_run_s_shards_and_reports_the_loss_there(
    tmp_path, embedded_shards
):
    report = probe(tmp_path, embedded_shards)
    assert report["verdict"] == "pass", report.get("problems") or report.get("error")
    assert report["stages"]["data"]["shards"] == embedded_shards["train"]  # no data made: the run's own
    found = report["stages"]["peak probe"]
    assert (found["steps"], found["warmup_steps"], found["peak_learning_rate"]) == (60, 15, 5e-4)  # the default's
    windows = found["windows"]
    assert [window["step"] for window in windows] == list(range(3, 61, 3))
    # the warmup's windows below the peak, every later one trained at it (the last reports the step after the run)
    assert all(window["learning_rate"] < 5e-4 for window in windows[:4])
    assert all(window["learning_rate"] == pytest.approx(5e-4) for window in windows[5:-1])
    at_peak = [window["loss"] for window in windows if window["step"] > 15]
    assert found["loss_at_peak"] == [at_peak[0], at_peak[-1]] and at_peak[-1] < at_peak[0] and found["stable"]
    assert found["passes_over_the_shards"] < 1 and report["warnings"] == []
    assert found["gradient_norm_at_peak"][1] == max(w["gradient_norm"] for w in windows if w["step"] > 15)


def test_a_peak_the_loss_does_not_fall_at_is_a_failed_verdict_that_says_what_to_try(tmp_path, embedded_shards):
    """Adam's steps are about the learning rate in size: at 2 the tiny model's loss climbs from the warmup on, to
    hundreds (far from a threshold: the run's own noise cannot change the verdict)."""
    report = probe(tmp_path, embedded_shards, steps=20, batch=64, learning_rate=2.0)
    found = report["stages"]["peak probe"]
    assert not found["stable"] and report["verdict"] == "fail"
    samples = read_manifest(embedded_shards["train"])["num_records"]
    assert found["passes_over_the_shards"] == pytest.approx(20 * 64 / samples) and samples < 20 * 64
    assert any(warning.startswith("the probe read its shards 1.") for warning in report["warnings"])
    (problem,) = report["problems"]
    assert problem.startswith("at the peak learning rate 2 the loss did not fall at the peak (") and "rose" in problem
    # the default recipe clips at 1.0: tighter clipping is the advice
    assert "try --clip_norm 0.5 or a lower --learning_rate, and probe again before the long run" in problem


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"peak_probe_steps": 30}, "--peak-probe-steps=30: must be 0 (no probe) or a multiple of 20"),
        ({"train_shards": "gs://b/train"}, "--tokenizer='': must be given with --train_shards"),
        ({"clip_norm": -1.5}, "--clip-norm=-1.5: must be 0 (no clipping) or positive"),
    ],
)
def test_a_smoke_test_refuses_a_probe_or_recipe_the_run_would_refuse(settings, message):
    with pytest.raises(InvalidParameter) as refused:
        SmokeArguments(scratch="/tmp/smoke", accelerator="cpu", **settings)
    assert str(refused.value).startswith(message)


def test_a_smoke_job_stopped_while_its_tpu_start_hangs_still_reports_where(tmp_path):
    """Vertex AI ends the job (its timeout, a cancel) while the TPU's initialisation hangs in native code: the
    process is ended without unwinding, and the report still says at which stage and why."""
    scratch, marker = tmp_path / "smoke", tmp_path / "hanging"
    hang = ["--function", "components.train:select_strategy", "--action", "hang", "--marker", str(marker)]
    hang += ["--exit_grace", "2"]
    run = ["pipelines.smoke_job", "--scratch", str(scratch), "--accelerator", "cpu", "--model_config", "tiny"]
    run += ["--steps", "3", "--per_replica_batch_size", "8", "--vocab_size", "6000", "--max_length", "32"]
    process = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "tests" / "kill_at.py"), *hang, "--", *run],
        cwd=PROJECT_ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    wait_for(marker.exists, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM, process.stderr.read()[-3000:]
    report = json.loads((scratch / "smoke.json").read_text())
    assert report["verdict"] == "fail" and report["failed_at"] == "train"
    assert report["error"].startswith("SIGTERM: the step did not stop within 2 s (a long native call")
    assert "seconds" in report["stages"]["data"]  # the stages before it, as they were written


def test_the_smoke_job_on_a_slice_runs_every_host_under_the_launcher_in_one_pool_on_demand(capsys):
    from google.cloud import aiplatform_v1 as vertex

    common = [*("--project", "my-project-123", "--scratch", "gs://bucket/smoke", "--tpu_type", "v5e-16")]
    common += [*("--tpu_image", "us-docker.pkg.dev/p/r/tpu:1", "--dry_run", "--json")]
    assert submit_smoke.main(common) == 0
    job = vertex.CustomJob.from_json(json.dumps(json.loads(capsys.readouterr().out)["would_create"]))
    (pool,) = job.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.machine_spec.tpu_topology, pool.replica_count) == (
        "ct5lp-hightpu-4t",
        "4x4",
        1,
    )
    folder = job.job_spec.base_output_directory.output_uri_prefix
    launcher = ["python", "-m", "components.slice", "--tpu_type", "v5e-16", "--report_dir", folder, "--"]
    assert list(pool.container_spec.command) == [*launcher, "python", "-m", "pipelines.smoke_job"]
    (run,) = HfArgumentParser(SmokeArguments).parse_args_into_dataclasses(args=list(pool.container_spec.args))
    assert (run.replicas, run.per_replica_batch_size, run.gradient_accumulation_steps) == (16, 128, 1)
    assert submit_smoke.main([*common, "--tpu_provisioning", "SPOT"]) == 2  # no Spot for slices on Vertex AI
    assert "Vertex AI has no Spot for TPU slices of several hosts" in capsys.readouterr().err


def test_the_smoke_job_is_a_custom_job_on_the_tpu_with_a_hard_limit_no_retries_and_the_runtime_env(capsys):
    from google.cloud import aiplatform_v1 as vertex

    code = submit_smoke.main(
        [
            *("--project", "my-project-123", "--scratch", "gs://bucket/smoke", "--tpu_type", "v5e-4"),
            *("--tpu_image", "us-docker.pkg.dev/p/r/tpu:1", "--tpu_provisioning", "SPOT"),
            *("--tpu_env", "TF_XLA_FLAGS=", "LIBTPU_INIT_ARGS=--xla_tpu_enable_latency_hiding_scheduler"),
            *("--service_account", "trainer@my-project-123.iam.gserviceaccount.com", "--dry_run", "--json"),
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    job = vertex.CustomJob.from_json(json.dumps(printed["would_create"]))  # what the API takes, field by field
    pool = job.job_spec.worker_pool_specs[0]
    assert (pool.machine_spec.machine_type, pool.machine_spec.tpu_topology) == ("ct5lp-hightpu-4t", "2x2")
    assert job.job_spec.scheduling.timeout.total_seconds() == 20 * 60
    assert job.job_spec.scheduling.strategy == vertex.Scheduling.Strategy.SPOT
    assert job.job_spec.scheduling.disable_retries and not job.job_spec.scheduling.restart_job_on_worker_restart
    env = {variable.name: variable.value for variable in pool.container_spec.env}
    assert "TF_XLA_FLAGS" not in env and env["LIBTPU_INIT_ARGS"] == "--xla_tpu_enable_latency_hiding_scheduler"
    assert env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == "/lib/libtpu.so"
    # the container's command line is the in-job script's, at the TPU's batch
    assert list(pool.container_spec.command) == ["python", "-m", "pipelines.smoke_job"]
    (run,) = HfArgumentParser(SmokeArguments).parse_args_into_dataclasses(args=list(pool.container_spec.args))
    assert (run.accelerator, run.replicas, run.tpu_type, run.bf16) == ("tpu", 4, "v5e-4", True)
    assert run.exit_zero  # the verdict is in the report: a failed exit would have Vertex AI restart the worker
    assert run.per_replica_batch_size * 4 * run.gradient_accumulation_steps == 2048
    assert run.scratch.startswith("gs://bucket/smoke/smoke-v5e-4-")
    assert job.job_spec.base_output_directory.output_uri_prefix == run.scratch
    assert job.job_spec.service_account == "trainer@my-project-123.iam.gserviceaccount.com"
    assert printed["cost_limit"].startswith("at most $0.33: 20 min of a v5e-4 at $0.98 an hour Spot")
    # a peak probe the job's time limit cannot hold, by the estimate, is refused before anything is sent
    long = [*SMOKE_JOB, "--scratch", "gs://b/s"]  # a v5e-1
    assert submit_smoke.main([*long, "--peak_probe_steps", "600", "--dry_run"]) == 2
    refusal = capsys.readouterr().err.strip().splitlines()[-1]
    assert refusal.startswith("error: --timeout-minutes=20: cannot hold the 630 steps (the smoke's and the peak")
    assert "min at 40% MFU before any compile: raise it (at most 120)" in refusal


def test_the_run_s_own_shards_its_recipe_and_the_peak_probe_reach_the_smoke_job(gcs, embedded_shards, capsys):
    """The shards are read before the job is created (their manifest sizes the memory check); knobs not given stay
    the recipe's."""
    for name in ("train", "tokenizer"):
        storage.upload_folder(Path(embedded_shards[name]), f"{gcs}/run/{name}")
    own = ["--train_shards", f"{gcs}/run/train", "--tokenizer", f"{gcs}/run/tokenizer"]
    probed = [*own, "--peak_probe_steps", "600", "--clip_norm", "1.0"]
    probed += ["--per_replica_batch_size", "8", "--gradient_accumulation_steps", "1"]  # what the embedded shards hold
    assert submit_smoke.main([*SMOKE_JOB, "--scratch", f"{gcs}/smoke", *probed, "--dry_run", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["would_create"]
    (run,) = HfArgumentParser(SmokeArguments).parse_args_into_dataclasses(
        args=job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"]
    )
    assert (run.train_shards, run.tokenizer) == (f"{gcs}/run/train", f"{gcs}/run/tokenizer")
    assert (run.peak_probe_steps, run.clip_norm, run.learning_rate) == (600, 1.0, -1)
    missing = ["--train_shards", f"{gcs}/run/nothing", "--tokenizer", f"{gcs}/run/tokenizer"]
    refused = run_module("pipelines.submit_smoke", *SMOKE_JOB, "--scratch", f"{gcs}/smoke", *missing, "--dry_run")
    assert refused.returncode == 2 and "--train-shards=" in refused.stderr.strip().splitlines()[-1]
    local = run_module(
        "pipelines.submit_smoke",
        *SMOKE_JOB,
        "--scratch",
        f"{gcs}/smoke",
        "--train_shards",
        "/tmp/t",
        "--tokenizer",
        "/k",
    )
    assert local.stderr.strip().splitlines()[-1] == (
        "error: --train-shards='/tmp/t': must be a gs:// folder: the job on Vertex AI reads it"
    )


def test_smoke_creates_the_job_follows_it_and_prints_the_report_it_wrote_when_no_tpu_is_found(gcs):
    from vertex_server import VertexStandIn

    with VertexStandIn() as vertex:
        result = run_module(
            "pipelines.submit_smoke",
            *(
                "--project",
                "my-project-123",
                "--scratch",
                gcs,
                "--tpu_type",
                "v5e-1",
                "--tpu_image",
                "us-docker.pkg.dev/p/r/tpu:1",
            ),
            *("--api_endpoint", vertex.url, "--poll_seconds", "0.2"),
        )
        (job,) = vertex.jobs.values()
    assert result.returncode == 1, result.stderr[-3000:]
    assert job["state"] == "JOB_STATE_SUCCEEDED"  # the job wrote its report and exited 0: nothing to restart
    assert "JOB_STATE_RUNNING" in result.stderr and "JOB_STATE_SUCCEEDED" in result.stderr
    assert "verdict: FAIL" in result.stderr and result.stdout == ""  # a failed verdict is the error, on stderr
    assert "failed at the runtime stage" in result.stderr and "no TPU found" in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1].startswith("error: the smoke test failed on the v5e-1: InvalidParameter")
    )
    (report,) = storage.glob(f"{gcs}/smoke-v5e-1-*/smoke.json")
    assert json.loads(storage.read_text(report))["failed_at"] == "runtime"


def test_a_slice_whose_hosts_are_not_found_says_so_from_its_hosts_reports(gcs, monkeypatch):
    """The smoke job on a v5e-16 where neither TPU_WORKER_* nor the metadata say who the hosts are (this machine):
    the launcher fails before the smoke test starts, and its host report says why."""
    from vertex_server import VertexStandIn

    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server answers (the job's environment)
    with VertexStandIn() as vertex:
        result = run_module(
            "pipelines.submit_smoke",
            *("--project", "my-project-123", "--scratch", gcs, "--tpu_type", "v5e-16"),
            *("--tpu_image", "us-docker.pkg.dev/p/r/tpu:1", "--api_endpoint", vertex.url, "--poll_seconds", "0.2"),
        )
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "without a report" in last and "the slice's hosts said: host " in last
    assert "found no TPU slice hosts: TPU_WORKER_ID and TPU_WORKER_HOSTNAMES are not set" in last


SMOKE_JOB = ["--project", "my-project-123", "--tpu_type", "v5e-1", "--tpu_image", "us-docker.pkg.dev/p/r/tpu:1"]


def wait_for(condition, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
        time.sleep(0.1)


def test_smoke_cancels_a_job_that_stays_queued_and_says_what_to_check(gcs):
    from vertex_server import VertexStandIn

    with VertexStandIn(start_jobs=False) as vertex:  # no TPU capacity or quota: the job never starts
        result = run_module(
            "pipelines.submit_smoke",
            *SMOKE_JOB,
            *("--scratch", gcs, "--api_endpoint", vertex.url, "--poll_seconds", "0.2", "--tpu_provisioning", "SPOT"),
            *("--max_queued_minutes", "0.05"),
        )
        (name,) = vertex.jobs
    assert result.returncode == 1, result.stderr[-3000:]
    assert vertex.cancel_requests == [name] and vertex.jobs[name]["state"] == "JOB_STATE_CANCELLED"
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {name} stayed queued or pending for more than 0.05 min and was cancelled (JOB_STATE_CANCELLED); "
        "check the project's Vertex AI training quota for the v5e-1 in us-central1 (console: IAM & Admin > Quotas), "
        "that us-central1 offers it for Vertex AI training, Spot capacity (try --tpu_provisioning STANDARD), or try "
        "another region"
    )


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_cancels_the_smoke_job_and_a_second_leaves_without_waiting(gcs, presses):
    from vertex_server import VertexStandIn

    # a job still pending; on the second press, a cancel that has not taken yet
    with VertexStandIn(start_jobs=False, cancels_take=presses == 1) as vertex:
        command = [sys.executable, "-m", "pipelines.submit_smoke", *SMOKE_JOB, "--scratch", gcs]
        process = subprocess.Popen(
            [*command, "--api_endpoint", vertex.url, "--poll_seconds", "0.2"],
            stderr=subprocess.PIPE,
            text=True,
            cwd=PROJECT_ROOT,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        )
        wait_for(lambda: vertex.jobs, process)
        process.send_signal(signal.SIGINT)
        if presses == 2:
            wait_for(lambda: vertex.cancel_requests, process)
            process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 1
        stderr = process.stderr.read()
        (name,) = vertex.jobs
    assert vertex.cancel_requests == [name] and "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    if presses == 1:
        assert vertex.jobs[name]["state"] == "JOB_STATE_CANCELLED"
        assert last == f"error: stopped by SIGINT: {name} is JOB_STATE_CANCELLED"
    else:
        assert vertex.jobs[name]["state"] == "JOB_STATE_CANCELLING"
        assert last == (
            f"error: left without waiting: the cancel of {name} was requested; see where it stands in the console, "
            "or cancel it again with: gcloud ai custom-jobs cancel 1 --region=us-central1 --project=my-project-123"
        )


def test_smoke_refused_by_google_cloud_says_so_in_one_line(gcs, tmp_path):
    from vertex_server import VertexStandIn

    with VertexStandIn(refuse_creates=True) as vertex:
        refused = run_module(
            "pipelines.submit_smoke",
            *SMOKE_JOB,
            "--scratch",
            gcs,
            "--api_endpoint",
            vertex.url,
            "--poll_seconds",
            "0.2",
        )
        assert not vertex.jobs
    assert refused.returncode == REFUSED_EXIT and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: Google Cloud refused the request (403 Forbidden): Permission 'aiplatform.customJobs.create' denied on "
        "resource 'projects/my-project-123/locations/us-central1'"
    )
    # no credentials on this machine (no ADC, no metadata server: its address is a closed local port)
    no_credentials = {
        **{key: value for key, value in os.environ.items() if key != "GOOGLE_APPLICATION_CREDENTIALS"},
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "NO_GCE_CHECK": "true",
    }
    unauthenticated = run_module("pipelines.submit_smoke", *SMOKE_JOB, "--scratch", gcs, env=no_credentials)
    assert unauthenticated.returncode == REFUSED_EXIT, unauthenticated.stderr[-3000:]
    assert unauthenticated.stderr.strip().splitlines()[-1] == (
        "error: no Google Cloud credentials on this machine: run gcloud auth application-default login (or set "
        "GOOGLE_APPLICATION_CREDENTIALS)"
    )


def test_smoke_reads_the_tpu_quota_first_and_creates_no_job_that_would_wait_for_it(gcs):
    """No on-demand v5e quota in the region (read through the Cloud Quotas API's stand-in): refused in one line before
    the job is created; --skip_quota_check creates it anyway (here: it then waits, and is cancelled)."""
    from quota_server import QuotaStandIn, StoredQuota
    from vertex_server import VertexStandIn

    from pipelines.quota import TPU_QUOTAS

    quota = TPU_QUOTAS["v5e", "STANDARD"]
    elsewhere = {quota.quota_id: StoredQuota({"europe-west4": 8})}  # the quota, in another region only
    with QuotaStandIn("my-project-123", elsewhere) as quotas, VertexStandIn(start_jobs=False) as vertex:
        where = ("--scratch", gcs, "--api_endpoint", vertex.url, "--quota_endpoint", quotas.url)
        refused = run_module("pipelines.submit_smoke", *SMOKE_JOB, *where, timeout=120)
        assert not vertex.jobs
        forced = run_module(
            "pipelines.submit_smoke",
            *SMOKE_JOB,
            *where,
            "--skip_quota_check",
            "--poll_seconds",
            "0.2",
            "--max_queued_minutes",
            "0.02",
            timeout=120,
        )
        assert len(vertex.jobs) == 1 and len(quotas.requests) == 1
    assert refused.returncode == 2 and forced.returncode == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: --tpu-type='v5e-1': TPU quota missing: {quota.quota_id} in us-central1 is 0 chips, the v5e-1"
        )
    )
