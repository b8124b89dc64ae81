"""``submit`` as a user runs it (the CLI in its own process) against the Vertex AI stand-in (tests/vertex_server.py)
and the Cloud Quotas stand-in (tests/quota_server.py): what it prints of a run it created when a later request
fails, and the quotas it reads before it creates anything."""

from __future__ import annotations

import json

import pytest
from conftest import own_aiplatform_settings, run_module
from quota_server import QuotaStandIn, StoredQuota
from vertex_server import VertexStandIn

from components.lib.errors import InvalidParameter
from pipelines.quota import CPU_QUOTA, TPU_QUOTAS
from pipelines.submit import SubmitArguments, submit

PROJECT, REGION = "my-project", "us-central1"
COMMAND_SECONDS = 120  # one command's run, its imports included: a hang fails the test with the command's output
ENOUGH_TPU = {TPU_QUOTAS["v5e", "STANDARD"].quota_id: StoredQuota({REGION: 64})}


def submit_command(
    template: str, vertex: VertexStandIn, quotas: QuotaStandIn, root: str, *extra: str, values: dict | None = None
):
    values = values or {"corpus": "hf:wikitext:wikitext-103-raw-v1"}
    return run_module(
        "pipelines.cli",
        *("submit", "--template", template, "--project", PROJECT, "--region", REGION),
        *("--pipeline_root", root, "--api_endpoint", vertex.url, "--quota_endpoint", quotas.url),
        *("--parameters", json.dumps(values), "--corpus_bytes", "546500949"),
        *extra,
        timeout=COMMAND_SECONDS,
    )


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_run_that_cannot_join_its_experiment_is_named_first_and_never_sent_twice(template, gcs):
    """The run exists once created: its name and its follow and cancel commands are printed before aiplatform adds
    it to the experiment. Here the link is refused (an account without aiplatform.contexts.addContextChildren): one
    line says so and that the run goes on, submit exits 0, and the stand-in holds one run."""
    name = f"projects/{PROJECT}/locations/{REGION}/pipelineJobs/linked-run"
    with VertexStandIn(refuse_links=True) as vertex, QuotaStandIn(PROJECT, ENOUGH_TPU) as quotas:
        result = submit_command(
            template, vertex, quotas, f"{gcs}/root", "--run_name", "linked-run", "--experiment", "wikitext-base"
        )
        runs = list(vertex.pipeline_jobs)
        store = f"projects/{PROJECT}/locations/{REGION}/metadataStores/default/contexts"
        experiment = vertex.contexts[f"{store}/wikitext-base"]  # found or made before the run, as aiplatform does
    assert result.returncode == 0, result.stderr[-3000:]
    assert runs == [name] and experiment["childContexts"] == []
    printed = result.stdout.splitlines()
    assert printed[0] == f"submitted {name}"
    cancel = printed.index(f"cancel:      tpu-mlm cancel linked-run --project {PROJECT} --region {REGION}")
    assert printed[cancel + 1 :][-1] == (
        "experiment:  not added to wikitext-base (Google Cloud refused the request (403 Forbidden): Permission "
        f"'aiplatform.contexts.addContextChildren' denied on '{store}/wikitext-base'); the run goes on without it: "
        "do not submit it again"
    )
    assert "could not be associated" not in result.stderr  # aiplatform's own error, not raised through submit


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_an_experiment_that_cannot_be_found_or_made_refuses_the_run_before_it_exists(template, gcs):
    """The experiment's name taken by a context that is no experiment: aiplatform's check, before the run is
    created, fails; one line says so and that no run was submitted, and the stand-in holds none."""
    store = f"projects/{PROJECT}/locations/{REGION}/metadataStores/default"
    with VertexStandIn() as vertex, QuotaStandIn(PROJECT, ENOUGH_TPU) as quotas:
        vertex.create_context(store, "wikitext-base", {"schemaTitle": "system.PipelineRun"})
        result = submit_command(template, vertex, quotas, f"{gcs}/root", "--experiment", "wikitext-base")
        runs = list(vertex.pipeline_jobs)
    assert result.returncode == 1 and not result.stdout and runs == []
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: experiment wikitext-base: ") and error.endswith("; no run was submitted")


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_the_tensorboard_folder_submit_prints_is_the_one_the_attached_job_writes_to(template, gcs, tmp_path):
    """With ``vertex_tensorboard`` and ``output_root`` both set: submit prints ROOT/tensorboard, ROOT the output_root;
    the launcher gives the attached TPU job that run's folder under the same root (the executor input carries the
    output_root, as the pipeline hands it), and the job's AIP_TENSORBOARD_LOG_DIR, what the train step writes to, is
    inside the folder submit printed."""
    from test_launch_custom_job import job, launcher

    board = f"projects/{PROJECT}/locations/{REGION}/tensorboards/123"
    values = {"corpus": "hf:wikitext:wikitext-103-raw-v1", "output_root": f"{gcs}/out", "vertex_tensorboard": board}
    with VertexStandIn() as vertex, QuotaStandIn(PROJECT, ENOUGH_TPU) as quotas:
        submitted = submit_command(template, vertex, quotas, f"{gcs}/root", "--run_name", "boarded-run", values=values)
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        (line,) = [line for line in submitted.stdout.splitlines() if line.startswith("tensorboard:")]
        printed = line.split("--logdir ", 1)[1].split()[0]
        assert printed == f"{gcs}/out/tensorboard"

        payload = job("import os; print(os.environ['AIP_TENSORBOARD_LOG_DIR'])")
        payload["job_spec"]["tensorboard"] = board
        payload["job_spec"]["base_output_directory"] = {"output_uri_prefix": ""}  # as GCPC compiles it: empty
        executor_input = {"inputs": {"parameterValues": {"output_root": values["output_root"]}}}
        container = payload["job_spec"]["worker_pool_specs"][0]["container_spec"]
        container["args"] = ["--executor_input", json.dumps(executor_input)]
        launched = run_module(
            "pipelines.launch_custom_job",
            *launcher(vertex, payload, tmp_path / "record"),
            *("--run_name", "boarded-run", "--pipeline_root", f"{gcs}/root"),
            timeout=COMMAND_SECONDS,
        )
        assert launched.returncode == 0, launched.stderr[-3000:]
        (name,) = vertex.jobs
        written = vertex.logs[name].strip()
    assert written == f"{printed}/boarded-run/logs/"


def test_a_run_whose_cpu_tasks_the_region_cannot_hold_is_refused_before_anything_is_created(
    template, gcs, monkeypatch, capsys
):
    """16 parts: 2 x 16 shards tasks of 8 vCPUs at once, 256 vCPUs; the region's custom-training CPU quota is 24 (the
    TPU's is there). submit reads both before anything is sent and refuses in one line naming num_parts and the most
    parts that fit; the dry run's bill shows the 256 vCPUs and reads no quota. In this process (aiplatform's settings
    for this test only), as the CLI runs it."""
    own_aiplatform_settings(monkeypatch)
    values = {"corpus": "hf:wikitext:wikitext-103-raw-v1", "num_parts": 16}
    quotas_held = {**ENOUGH_TPU, CPU_QUOTA.quota_id: StoredQuota({REGION: 24})}
    with VertexStandIn() as vertex, QuotaStandIn(PROJECT, quotas_held) as quotas:
        given = {
            "project": PROJECT,
            "region": REGION,
            "pipeline_root": f"{gcs}/root",
            "template": template,
            "parameters": json.dumps(values),
            "corpus_bytes": 546500949,
            "api_endpoint": vertex.url,
            "quota_endpoint": quotas.url,
        }
        with pytest.raises(InvalidParameter) as refused:
            submit(SubmitArguments(**given))
        read = [request.rsplit("/", 1)[1] for request in quotas.requests]
        submit(SubmitArguments(**given, dry_run=True))
        assert not vertex.pipeline_jobs and len(quotas.requests) == len(read)  # the dry run read none
    assert read == [*ENOUGH_TPU, CPU_QUOTA.quota_id]
    assert str(refused.value).startswith(
        f'--num-parts=16: CPU quota too small: "{CPU_QUOTA.display_name}" ({CPU_QUOTA.quota_id}) in {REGION} is 24 '
        "vCPUs, the run's widest stage (shards: 2 x 16 part(s) at once) holds 256 vCPUs at once"
    )
    assert "take at most 1 part(s) (num_parts)" in str(refused.value) and "\n" not in str(refused.value)
    bill_rows = [line for line in capsys.readouterr().err.splitlines() if line.startswith("CPUs at once")]
    assert len(bill_rows) == 2  # the bill of each, printed before anything is read or sent
    assert all("256 vCPUs (shards: 2 x 16 part(s) at once)" in row for row in bill_rows)


@pytest.mark.parametrize("state", ["PIPELINE_STATE_QUEUED", "PIPELINE_STATE_RUNNING"])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_resume_is_refused_while_the_run_or_another_resume_of_it_has_not_ended(template, gcs, monkeypatch, state):
    """A resume that is queued has not taken the checkpoint folder's lease yet: a second resume of the same run, or
    a resume of a run still going, would pass the lease's check and train in the same folder. submit lists the
    pipeline's runs and refuses in one line naming the one still going and how to follow or stop it, before anything
    is created; once it has ended (failed, cancelled by tpu-mlm cancel), the resume is created. In this process
    (aiplatform's settings for this test only), as the CLI runs it; every run created ``state``."""
    from components.lib import storage
    from components.lib.errors import InvalidParameter, Refused
    from pipelines.runs import CancelArguments, cancel

    own_aiplatform_settings(monkeypatch)
    storage.write_text_atomic(f"{gcs}/root/checkpoints/wikitext-base-1/checkpoint", 'model_checkpoint_path: "ckpt-3"')
    where = f"--project {PROJECT} --region {REGION}"
    with VertexStandIn(pipeline_state=state) as vertex, QuotaStandIn(PROJECT, ENOUGH_TPU) as quotas:
        given = {
            "project": PROJECT,
            "region": REGION,
            "pipeline_root": f"{gcs}/root",
            "template": template,
            "parameters": json.dumps({"corpus": "hf:wikitext:wikitext-103-raw-v1"}),
            "corpus_bytes": 546500949,
            "api_endpoint": vertex.url,
            "quota_endpoint": quotas.url,
        }

        def refused_resume(run_name: str) -> str:
            created = list(vertex.pipeline_jobs)
            with pytest.raises(Refused) as refused:
                submit(SubmitArguments(**given, resume="wikitext-base-1", run_name=run_name))
            assert list(vertex.pipeline_jobs) == created  # refused before any create request
            return str(refused.value)

        created = list(vertex.pipeline_jobs)
        with pytest.raises(
            InvalidParameter, match=f"no run of tpu-mlm-pretraining of that name in project {PROJECT}, "
        ):
            submit(SubmitArguments(**given, resume="wikitext-base-1", run_name="resume-0"))  # not of this region
        assert list(vertex.pipeline_jobs) == created
        submit(SubmitArguments(**given, run_name="wikitext-base-1"))  # the run itself, not ended
        assert refused_resume("resume-1") == (
            f"--resume='wikitext-base-1': the run wikitext-base-1 is {state}: it trains in its checkpoint folder, and "
            f"a second training would write over its checkpoints: see it with tpu-mlm status wikitext-base-1 {where}, "
            f"stop it with tpu-mlm cancel wikitext-base-1 {where}, or wait until it ends, then submit again"
        )
        vertex.end_pipeline_job(pipeline_job("wikitext-base-1"), "PIPELINE_STATE_FAILED", "preempted")
        submit(SubmitArguments(**given, resume="wikitext-base-1", run_name="resume-1"))
        assert vertex.pipeline_jobs[pipeline_job("resume-1")]["state"] == state  # its training not started
        message = refused_resume("resume-2")
        assert message.startswith(f"--resume='wikitext-base-1': resume-1, a resume of it, is {state}: it trains in ")
        assert f"tpu-mlm status resume-1 {where}" in message and f"tpu-mlm cancel resume-1 {where}" in message
        assert "\n" not in message

        cancelled = cancel(CancelArguments(run="resume-1", yes=True, poll_seconds=0.05, **where_of(given)))
        assert cancelled["state"] == "PIPELINE_STATE_CANCELLED"
        submit(SubmitArguments(**given, resume="wikitext-base-1", run_name="resume-2"))
        resumed = vertex.pipeline_jobs[pipeline_job("resume-2")]
    assert resumed["labels"]["tpu-mlm-resumed-from"] == "wikitext-base-1"


def pipeline_job(run: str) -> str:
    return f"projects/{PROJECT}/locations/{REGION}/pipelineJobs/{run}"


def where_of(given: dict) -> dict:
    return {key: given[key] for key in ("project", "region", "api_endpoint")}
