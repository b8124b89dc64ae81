import json
import os
import re

import pytest
from conftest import PROJECT_ROOT, own_aiplatform_settings, run_module
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient
from google.cloud.aiplatform_v1.types import pipeline_job as gca_pipeline_job
from vertex_server import VertexStandIn

from components.lib.errors import InvalidParameter
from pipelines.run_folders import PIPELINE_NAME
from pipelines.submit import SubmitArguments, submit
from pipelines.submit import main as submit_main


def arguments(template_path, **overrides) -> SubmitArguments:
    values = {
        "project": "my-project",
        "pipeline_root": "gs://bucket/root",
        "template": template_path,
        "region": "europe-west4",
        "service_account": "trainer@my-project.iam.gserviceaccount.com",
        "parameters": json.dumps(
            {
                "corpus": "hf:wikitext:wikitext-103-raw-v1",
                "max_steps": 1000,
                "learning_rate": 2e-4,
                "hub_repo_id": "me/roberta",
                "hf_token_secret": "projects/my-project/secrets/hf-token",
            }
        ),
        "labels": "team=nlp,run=first",
    }
    return SubmitArguments(**{**values, **overrides})


@pytest.fixture
def vertex(monkeypatch):
    """The Vertex AI stand-in, where a resume lists the pipeline's runs before it is created; aiplatform's settings
    for this test only (submit's init sets them)."""
    own_aiplatform_settings(monkeypatch)
    with VertexStandIn() as stand_in:
        # the run the tests resume, failed, in the region they submit to: a resume is of a run of that region
        parent = "projects/my-project/locations/europe-west4"
        spec = {"pipelineInfo": {"name": PIPELINE_NAME}, "root": {"dag": {"tasks": {}}}}
        stand_in.create_pipeline_job(parent, "wikitext-base-1", {"pipelineSpec": spec, "runtimeConfig": {}})
        stand_in.end_pipeline_job(f"{parent}/pipelineJobs/wikitext-base-1", "PIPELINE_STATE_FAILED")
        yield stand_in


def fake_create_pipeline_job(sent: list):
    """Vertex AI's API call, intercepted at the client: the request is kept, nothing is sent."""

    def create_pipeline_job(self, request=None, *, parent=None, pipeline_job=None, pipeline_job_id=None, **_):
        sent.append({"parent": parent, "job": pipeline_job, "id": pipeline_job_id})
        return gca_pipeline_job.PipelineJob(
            name=f"{parent}/pipelineJobs/{pipeline_job_id}", display_name=pipeline_job.display_name
        )

    return create_pipeline_job


def test_submit_sends_one_request_with_template_root_parameters_and_service_account(template, monkeypatch, gcs):
    sent = []
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", fake_create_pipeline_job(sent))
    result = submit(arguments(template), credentials=AnonymousCredentials())

    (request,) = sent
    assert request["parent"] == "projects/my-project/locations/europe-west4"
    job = request["job"]
    assert job.service_account == "trainer@my-project.iam.gserviceaccount.com"
    assert job.runtime_config.gcs_output_directory == "gs://bucket/root"
    values = dict(job.runtime_config.parameter_values)
    assert values["corpus"] == "hf:wikitext:wikitext-103-raw-v1" and values["max_steps"] == 1000
    assert values["hf_token_secret"] == "projects/my-project/secrets/hf-token"
    assert dict(job.labels) == {"team": "nlp", "run": "first"}
    spec = dict(job.pipeline_spec)
    assert spec["pipelineInfo"]["name"] == "tpu-mlm-pretraining"
    assert "train-step" in spec["root"]["dag"]["tasks"]
    assert result["job"].endswith(request["id"])


@pytest.mark.parametrize("enable_caching", [None, True, False])
def test_the_request_keeps_each_step_s_compiled_caching_unless_asked(template, monkeypatch, gcs, enable_caching):
    sent = []
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", fake_create_pipeline_job(sent))
    submit(arguments(template, enable_caching=enable_caching), credentials=AnonymousCredentials())
    (job,) = (request["job"] for request in sent)
    tasks = dict(job.pipeline_spec)["root"]["dag"]["tasks"]
    cached = {name for name, task in tasks.items() if task.get("cachingOptions", {}).get("enableCache")}
    if enable_caching is None:  # as compiled: the data steps reuse results; preflight and training always run
        assert {"tokenizer-step", "merge-shards-step", "merge-shards-step-2", "evaluate-step"} <= cached
        assert not {"train-step", "preflight-step"} & cached
    else:
        assert cached == (set(tasks) if enable_caching else set())


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_dry_run_prints_the_job_and_sends_nothing(template, monkeypatch, capsys):
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", lambda *a, **k: pytest.fail("sent a request"))
    result = submit(arguments(template, dry_run=True))
    request = result["would_submit"]
    assert request["runtimeConfig"]["gcsOutputDirectory"] == "gs://bucket/root"
    assert request["runtimeConfig"]["parameterValues"]["hub_repo_id"] == "me/roberta"
    assert request["serviceAccount"] == "trainer@my-project.iam.gserviceaccount.com"
    assert "train-step" in request["pipelineSpec"]
    cli = run_module(
        "pipelines.submit",
        "--template",
        template,
        "--project",
        "my-project",
        "--pipeline_root",
        "gs://bucket/root",
        "--parameters",
        '{"corpus": "hf:wikitext:wikitext-103-raw-v1"}',
        "--corpus_bytes",
        "546500949",
        "--dry_run",
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    printed = cli.stdout.strip().splitlines()
    assert printed[0] == (
        "dry run: would submit 'tpu-mlm v5e-4 corpus=hf:wikitext:wikitext-103-raw-v1' with 1 parameter values, "
        "root gs://bucket/root (--json prints the request)"
    )
    # the run's name, and what it names: its checkpoints, its TensorBoard logs, the commands that follow it
    name = re.fullmatch(r"run: +(tpu-mlm-\d{8}-\d{6})", printed[1]).group(1)
    assert f"checkpoints: gs://bucket/root/checkpoints/{name}" in printed
    assert f"tensorboard: tensorboard --logdir gs://bucket/root/tensorboard  (this run: {name})" in printed
    assert f"status:      tpu-mlm status {name} --project my-project --region us-central1" in printed
    assert len(printed) < 10  # the request itself only with --json
    capsys.readouterr()
    assert submit_main([*cli.args[3:], "--json", "--run_name", "wikitext-base-1"]) == 0  # the same job in this process
    printed = json.loads(capsys.readouterr().out)
    assert printed["would_submit"]["name"] == "wikitext-base-1"
    assert printed["follow"]["checkpoints"] == "gs://bucket/root/checkpoints/wikitext-base-1"


def test_a_first_run_is_the_same_pipeline_on_a_sample_for_a_few_steps_without_the_push(template, capsys):
    long_run = {
        "corpus": "hf:wikitext:wikitext-103-raw-v1",
        "checkpoint_dir": "gs://bucket/checkpoints/roberta",
        "hub_repo_id": "me/roberta",
        "hf_token_secret": "projects/my-project/secrets/hf-token",
        "learning_rate": 2e-4,
        "num_parts": 8,
        "tpu_job_timeout_hours": 48,
    }
    given = {"dry_run": True, "corpus_bytes": 546_500_949, "parameters": json.dumps(long_run)}
    result = submit(arguments(template, first_run=True, **given))
    request = result["would_submit"]
    values = request["runtimeConfig"]["parameterValues"]
    assert values == {
        "corpus": "hf:wikitext:wikitext-103-raw-v1",
        "hf_token_secret": "projects/my-project/secrets/hf-token",
        "learning_rate": 2e-4,  # the long run's recipe, on its TPU
        "limit": 50_000,
        "num_parts": 1,
        "holdout_fraction": 0.2,
        "records_per_shard": 1_000,
        "max_steps": 100,
        "checkpoint_every_steps": 50,
        "log_every_steps": 10,
        "tpu_job_timeout_hours": 0.0,  # derived from the first run's estimate, not the long run's limit
        "eval_max_batches": 2,  # the evaluation's and the probe's paths, on a few batches
        "downstream_max_steps": 2,
        "downstream_max_eval_samples": 32,
        "downstream_learning_rates": "2e-05",  # the default grid's first: one fine-tuning a model, none to choose
        "rehearse_restart": True,  # the restore path, at its first checkpoint
    }  # no checkpoint_dir (the long run's would resume a 100-step schedule), no push
    assert all(type(values[name]) is float for name in ("holdout_fraction", "tpu_job_timeout_hours"))  # KFP's type
    assert (
        request["displayName"].startswith("tpu-mlm v5e-4 corpus=hf:wikitext")
        and "(first run)" in request["displayName"]
    )
    assert re.fullmatch(r"tpu-mlm-\d{8}-\d{6}-first-run", request["name"])
    assert request["labels"] == {"team": "nlp", "run": "first", "tpu-mlm-kind": "first-run"}
    assert result["estimate"]["steps"] == 100
    assert result["estimate"]["bill"]["limit"] == 50_000  # the sample's texts, their length assumed: said so
    assert result["first_run"].startswith("100 steps on a sample, about ")
    assert "when it succeeds it proves the compiled pipeline's" in result["first_run"]
    assert "a restart that restores one into the TPU's variables" in result["first_run"]
    assert result["first_run"].endswith(  # what it leaves to the long run: its parts and push among them
        "it does not run the data steps' 8 parts side by side (it reads a sample in one), the Hub push "
        "(--first_run_push tries it), the evaluation and the probe at their full size (the probe's choice of rates "
        "among it), or a preemption in a new job"
    )
    grids = {**long_run, "downstream_learning_rates": "1e-3,3e-4", "downstream_random_init_learning_rates": "3e-3,1e-3"}
    first = submit(arguments(template, first_run=True, **{**given, "parameters": json.dumps(grids)}))
    values = first["would_submit"]["runtimeConfig"]["parameterValues"]
    assert (values["downstream_learning_rates"], values["downstream_random_init_learning_rates"]) == ("0.001", "0.003")
    assert first["estimate"]["probe"]["fine_tunings"] == 2
    misspelt = {**long_run, "downstream_learning_rates": "1e-3;3e-4"}
    with pytest.raises(InvalidParameter, match="1e-3;3e-4"):
        submit(arguments(template, first_run=True, **{**given, "parameters": json.dumps(misspelt)}))
    pushed = submit(arguments(template, first_run=True, first_run_push=True, **given))
    assert pushed["would_submit"]["runtimeConfig"]["parameterValues"]["hub_repo_id"] == "me/roberta"
    with pytest.raises(InvalidParameter, match="--first-run-push=True: is for --first_run"):
        submit(arguments(template, first_run_push=True, **given))


def test_a_first_run_s_display_name_fits_vertex_ai_and_names_the_values_it_runs_with(
    template, monkeypatch, gcs, capsys
):
    """A long corpus list: the automatic display name is cut so that " (first run)" still fits Vertex AI's 128
    characters, and it shows the parts the first run uses (1), not the long run's 16. A display name given that
    leaves no room for the suffix is refused in one line before any request."""
    sent = []
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", fake_create_pipeline_job(sent))
    files = ",".join(f"gs://bucket/corpus/part-{index:05d}.jsonl.gz" for index in range(16))
    long_run = {"num_parts": 16, "learning_rate": 2e-4, "corpus": files}
    given = {"corpus_bytes": 20_000_000_000, "parameters": json.dumps(long_run)}
    submit(arguments(template, first_run=True, **given), credentials=AnonymousCredentials())
    (request,) = sent
    name = request["job"].display_name
    assert len(name) == 128 and name.endswith(" (first run)")  # Vertex AI's longest
    assert name.startswith("tpu-mlm v5e-4 num_parts=1 learning_rate=0.0002 corpus=gs://bucket/corpus/part-00000")
    long_run = submit(arguments(template, dry_run=True, **given))["would_submit"]
    assert long_run["displayName"].startswith("tpu-mlm v5e-4 num_parts=16 ") and len(long_run["displayName"]) == 128
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", lambda *a, **k: pytest.fail("sent a request"))
    with pytest.raises(InvalidParameter, match=r"--display-name='x{120}': is 120 characters; Vertex AI takes 128, "):
        submit(arguments(template, first_run=True, display_name="x" * 120, **given), credentials=AnonymousCredentials())
    with pytest.raises(InvalidParameter, match=r"--display-name='x{129}': is 129 characters; Vertex AI takes 128$"):
        submit(arguments(template, display_name="x" * 129, **given), credentials=AnonymousCredentials())


def test_a_first_run_on_a_v5e_8_takes_20_minutes_by_the_estimate_which_counts_its_sample(tmp_path, capsys):
    """The issue's corpus (20 GB of .jsonl.gz, 16 parts for the long run) on a v5e-8: the first run's bill counts
    the data steps of its sample (50,000 texts in one part), not of the corpus; its evaluation and probe run on a few
    batches; the estimate's run time from submit to the end is at most 20 minutes, and the printout says it."""
    from components.lib.estimates import ASSUMED_TEXT_BYTES, cpu_wall_hours, run_hours
    from pipelines.pipeline import compile_pipeline
    from pipelines.submit import summary_for_people

    v5e_8 = compile_pipeline(
        str(tmp_path / "pipeline.yaml"),
        target="vertex",
        cpu_image="us-docker.pkg.dev/p/r/cpu:1",
        tpu_image="us-docker.pkg.dev/p/r/tpu:1",
        tpu_type="v5e-8",
    )
    parameters = json.dumps({"corpus": "gs://b/c/*.jsonl.gz", "num_parts": 16, "model_config": "roberta-base"})
    given = {"dry_run": True, "corpus_bytes": 20_000_000_000, "parameters": parameters}
    first, long_run = (submit(arguments(v5e_8, **given, first_run=first_run)) for first_run in (True, False))
    steps = [{step["step"]: step for step in run["estimate"]["cpu_steps"]} for run in (first, long_run)]
    sample = 50_000 * ASSUMED_TEXT_BYTES  # one part's texts, of the corpus's 62 GB of text
    assert steps[0]["train shards"]["tasks"] == 1 and steps[1]["train shards"]["tasks"] == 16
    start = 3 / 60
    work = [runs["train shards"]["hours"] - runs["train shards"]["tasks"] * start for runs in steps]
    kept = [1 - run["estimate"]["data"]["holdout_fraction"] for run in (first, long_run)]  # 20% and 5% held out
    assert work[0] / kept[0] == pytest.approx(work[1] / kept[1] * sample / long_run["estimate"]["data"]["corpus_bytes"])
    assert steps[0]["evaluate"]["samples"] == 2 * 64 and steps[1]["evaluate"]["samples"] == 150 * 64
    assert steps[0]["downstream probe"]["hours"] < steps[1]["downstream probe"]["hours"] / 5
    minutes = run_hours(first["estimate"]) * 60
    assert minutes <= 20 < run_hours(long_run["estimate"]) * 60
    before, after = cpu_wall_hours(first["estimate"]["cpu_steps"])
    assert before + first["estimate"]["hours"] + after == pytest.approx(minutes / 60)
    printed = summary_for_people(first)
    assert f"first run: 100 steps on a sample, about {minutes:.0f} min from submit to the end (an estimate" in printed
    assert "the TPU job's start and compile, twice with the rehearsed restart, and any queue come on top" in printed
    bill = capsys.readouterr().err
    assert "at most 50,000 texts a part are read: the data steps above count them at 455 bytes a text" in bill


def test_dry_run_estimates_the_training_from_the_parameters(template, capsys):
    result = submit(arguments(template, dry_run=True))  # an hf: corpus: its size is not known here
    assert result["estimate"].startswith("no estimate: --corpus-bytes=0: the size of hf:wikitext")
    # files in a bucket: not read by a dry run (no TensorFlow line, no DNS), their size asked for
    in_a_bucket = json.dumps({"corpus": "gs://no-such-bucket-here/corpus/*.jsonl.gz"})
    result = submit(arguments(template, dry_run=True, parameters=in_a_bucket))
    assert result["estimate"].startswith("no estimate: --corpus-bytes=0: the size of gs://no-such-bucket-here")
    assert "gcloud storage du -s" in result["estimate"]
    parameters = {"corpus": "hf:wikitext:wikitext-103-raw-v1", "tpu_price_per_hour": 4.8, "per_replica_batch_size": 64}
    result = submit(arguments(template, dry_run=True, corpus_bytes=546_500_949, parameters=json.dumps(parameters)))
    estimate = result["estimate"]
    # the template's TPU (a v5e-4: 4 replicas) and defaults (one epoch, bf16, the TPU's 4 micro-batches), with the
    # values given
    assert estimate["tpu_type"] == "v5e-4" and estimate["global_batch_size"] == 64 * 4 * 4
    assert estimate["data"]["samples"] == int(546_500_949 * 0.95 * 0.312 // 128)  # the default 5% held out
    assert estimate["steps"] == estimate["data"]["samples"] // 1024
    assert estimate["cost"] == 4.8 * estimate["hours"]
    printed = capsys.readouterr().err
    probe_row = f"\n  downstream probe     {estimate['probe']['hours']:.2f} h ("
    assert "Estimate of the run on a v5e-4" in printed and probe_row in printed and "(6 fine-tunings a task)" in printed
    # the downstream probe by default: word-order, fine-tuned from the model and from its twin at three rates each
    # with one seed, on the 80% of its training lines not set aside to choose the rates, 3 epochs of 32-sample steps
    # but at least 100, at the training's 128 tokens, and scored (test and development lines), at the CPU rate
    # measured for roberta-base
    from components.lib.downstream_tasks import word_order_task

    task = word_order_task()
    train, validation = len(task.train.labels), len(task.validation.labels)
    dev = round(train * 0.2)
    steps = max(3 * -(-(train - dev) // 32), 100)
    samples = steps * 32 + (validation + dev) / 3
    flops = 6 * samples * 128 * estimate["model_flops_per_token"]  # six fine-tunings
    assert estimate["probe"]["hours"] == pytest.approx(flops / 343e9 / 3600 + 3 / 60)
    assert estimate["probe"]["cost"] == pytest.approx(estimate["probe"]["hours"] * 2 * 0.2185)
    # a Hub task's size is read by preflight: not counted unless bounded
    glue = {**parameters, "downstream_tasks": "word-order,hf:nyu-mll/glue:sst2", "downstream_seeds": "1,2"}
    unbounded = submit(arguments(template, dry_run=True, corpus_bytes=546_500_949, parameters=json.dumps(glue)))
    assert unbounded["estimate"]["probe"]["unknown"] == ["hf:nyu-mll/glue:sst2"]
    # two seeds: the second at each model's chosen rate, 8 fine-tunings for 6
    fine_tuned = [run["estimate"]["probe"]["hours"] - 3 / 60 for run in (unbounded, result)]
    assert fine_tuned[0] == pytest.approx(8 / 6 * fine_tuned[1])
    assert "not counted: hf:nyu-mll/glue:sst2" in capsys.readouterr().err
    # the bill: the TPU job as compiled, its limit derived as preflight derives it, and the most the run can cost
    bill = estimate["bill"]
    assert bill["machine_spec"] == {"machine_type": "ct5lp-hightpu-4t", "tpu_topology": "2x2"}
    assert bill["image"] == "us-docker.pkg.dev/p/r/tpu:1" and bill["provisioning"] == "STANDARD"
    assert bill["time_limit_hours"] == pytest.approx(max(2 * estimate["hours"] + 1, 2.0), abs=1e-3)
    assert bill["cpu_cost"] == pytest.approx(sum(step["cost"] for step in estimate["cpu_steps"]))
    assert bill["worst_cost"] == pytest.approx(4.8 * bill["time_limit_hours"] + bill["cpu_cost"])
    names = [step["step"] for step in estimate["cpu_steps"]]
    assert names == [
        "tokenizer",
        "train shards",
        "validation shards",
        "merge shards",
        "preflight",
        "evaluate",
        "downstream probe",
        "run report",
    ]
    bounded = {**glue, "downstream_max_train_samples": 1000, "downstream_max_steps": 100}
    counted = submit(arguments(template, dry_run=True, corpus_bytes=546_500_949, parameters=json.dumps(bounded)))
    assert counted["estimate"]["probe"]["unknown"] == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pipeline_root": "/local/root"}, r"--pipeline-root='/local/root': must be a gs:// URI"),
        ({"project": "My Project"}, r"--project='My Project': is not a Google Cloud project id"),
        ({"template": "/no/such.yaml"}, r"--template='/no/such.yaml': no such file"),
        ({"parameters": "{not json"}, r"--parameters='\{not json': is not a JSON object"),
        ({"parameters": '{"max_step": 10}'}, r"--parameters='max_step': is not a parameter of this pipeline"),
        ({"parameters": '{"max_steps": "ten"}'}, r"--max-steps='ten': must be of type number_integer"),
        ({"parameters": '{"bf16": 1}'}, r"--bf16=1: must be of type boolean"),
        ({"parameters": '{"hub_repo_id": "me/x"}'}, r"--hf-token-secret='': a Hub push on Vertex AI reads"),
        (
            {"parameters": '{"hub_repo_id": "bad id", "hf_token_secret": "projects/p/secrets/s"}'},
            r"--hub-repo-id='bad id'",
        ),
        (
            {"parameters": '{"hub_repo_id": "me/x", "hf_token_secret": "hf_abc123"}'},
            r"--hf-token-secret='hf_…\(redacted\)': must be a Secret Manager name",  # a token is never echoed
        ),
        ({"labels": "Team=NLP"}, r"--labels='Team=NLP'"),
        # what the run could only find out on Vertex AI, after paying for the steps before
        ({"parameters": '{"corpus": "/home/me/corpus.txt"}'}, r"--corpus='/home/me/corpus.txt': is a path on this"),
        ({"parameters": '{"output_root": "runs"}'}, r"--output-root='runs': is a path on this machine"),
        (
            {"parameters": '{"init_from": "runs/r/train-step/model"}'},
            r"--init-from='runs/r/train-step/model': is a path on this machine.*or name an hf: model",
        ),
        # the probe's tasks too: a misspelt built-in task, a labelled folder of this machine
        (
            {"parameters": '{"downstream_tasks": "word-ordr"}'},
            r"--downstream-tasks='word-ordr': 'word-ordr' is a path on this machine, which the probe on Vertex AI",
        ),
        (
            {"parameters": '{"downstream_tasks": "word-order,/home/me/labelled"}'},
            r"--downstream-tasks='word-order,/home/me/labelled': '/home/me/labelled' is a path on this machine",
        ),
        ({"parameters": '{"replicas": 8}'}, r"--replicas=8: a v5e-4 has 4"),
        ({"parameters": '{"tpu_max_queued_hours": 0.0}'}, r"--tpu-max-queued-hours=0.0: must be above 0 and at most"),
        ({"parameters": '{"vertex_tensorboard": "my-board"}'}, r"--vertex-tensorboard='my-board': must be a Tensor"),
        (
            {
                "corpus_bytes": 546_500_949,
                "parameters": '{"corpus": "hf:wikitext", "model_config": "roberta-large", "bf16": false}',
            },
            r"--per-replica-batch-size=128: needs at least .* GiB per replica",
        ),
        (
            {"corpus_bytes": 546_500_949, "parameters": '{"corpus": "hf:wikitext", "model_config": "roberta-huge"}'},
            r"--model-config='roberta-huge': unknown preset",
        ),
        ({"parameters": '{"corpus": "embedded"}'}, r"--per-replica-batch-size=128: x 4 replica\(s\) x 4 micro-batches"),
    ],
)
def test_bad_submissions_fail_before_any_request(template, monkeypatch, overrides, message):
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", lambda *a, **k: pytest.fail("sent a request"))
    with pytest.raises(InvalidParameter, match=message):
        submit(arguments(template, **overrides), credentials=AnonymousCredentials())


# Where a network call would go from a process with this environment: nowhere (a closed local port), so that a
# dry run that tried to reach Google Cloud, a bucket or the metadata server would fail or print it
OFFLINE = {
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "NO_GCE_CHECK": "true",
    "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent",
}


def documented_submits() -> list[list[str]]:
    """Every ``tpu-mlm submit`` command of submit's --help and the docs' shell blocks, as arguments (quoted values
    may run over several lines, as the examples' JSON does)."""
    import shlex

    import pipelines.submit

    docs = sorted((PROJECT_ROOT / "docs").glob("*.md"))
    texts = [pipelines.submit.__doc__, *(path.read_text() for path in docs)]
    commands = []
    for text in texts:
        lines = text.splitlines()
        for index, line in enumerate(lines):
            words = line.strip().split()
            if words[:2] not in (["tpu-mlm", "submit"], ["python", "-m"]) or "submit" not in " ".join(words[:3]):
                continue
            command = ""
            for following in lines[index:]:
                command += following.strip().removesuffix("\\") + " "
                try:
                    arguments = shlex.split(command)
                except ValueError:  # a quote still open: the next line belongs to it
                    continue
                if not following.rstrip().endswith("\\"):
                    break
            commands.append(arguments[3:] if arguments[0] == "python" else arguments[2:])
    return commands


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_the_documented_submit_commands_dry_run_offline_and_show_the_bill(template):
    """The examples of submit's --help and of the docs, run as written (with --dry_run and the test's template),
    where no network can be reached: each prints the bill without a network error, a TensorFlow line or a
    traceback."""
    commands = documented_submits()
    assert len(commands) >= 3  # --help's, docs/vertex-ai.md's, docs/big-corpora.md's
    for command in commands:
        command = [template if word == "pipeline.yaml" else word for word in command]
        if "--dry_run" not in command:
            command.append("--dry_run")
        result = run_module("pipelines.submit", *command, env={**os.environ, **OFFLINE}, timeout=120)
        assert result.returncode == 0, (command, result.stderr[-2000:])
        assert "most it can cost" in result.stderr and "dry run: would submit" in result.stdout, command
        for sign_of_the_network in ("Traceback", "Could not resolve", "DNS", "metadata server", "tensorflow"):
            assert sign_of_the_network not in result.stderr, (command, result.stderr[-2000:])


def test_a_failed_run_is_resumed_by_its_name_from_its_checkpoint_folder(template, monkeypatch, gcs, vertex):
    """--resume RUN: the run trains on in RUN's own checkpoint folder (under output_root, else the pipeline root);
    a folder without checkpoints (a misspelt name) is refused before anything is sent, in a dry run too."""
    from components.lib import storage

    values = {"corpus": "hf:wikitext:wikitext-103-raw-v1", "output_root": f"{gcs}/out"}
    given = {"parameters": json.dumps(values), "pipeline_root": f"{gcs}/root", "resume": "wikitext-base-1"}
    given["api_endpoint"] = vertex.url
    sent = []
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", fake_create_pipeline_job(sent))
    for dry_run in (True, False):
        with pytest.raises(InvalidParameter, match=r"--resume='gs://.*/out/checkpoints/wikitext-base-1': holds no "):
            submit(arguments(template, dry_run=dry_run, **given), credentials=AnonymousCredentials())
    assert not sent
    storage.write_text_atomic(f"{gcs}/out/checkpoints/wikitext-base-1/checkpoint", 'model_checkpoint_path: "ckpt-3"')
    planned = submit(arguments(template, dry_run=True, **given))["would_submit"]["runtimeConfig"]["parameterValues"]
    assert planned["checkpoint_dir"] == f"{gcs}/out/checkpoints/wikitext-base-1"
    submit(arguments(template, **given), credentials=AnonymousCredentials())
    (request,) = sent
    assert request["job"].runtime_config.parameter_values["checkpoint_dir"] == planned["checkpoint_dir"]
    assert request["job"].labels["tpu-mlm-resumed-from"] == "wikitext-base-1"  # clean reads it
    elsewhere = json.dumps({**values, "checkpoint_dir": f"{gcs}/other"})
    with pytest.raises(InvalidParameter, match="--resume='wikitext-base-1': its checkpoints are in"):
        submit(arguments(template, dry_run=True, **{**given, "parameters": elsewhere}))
    with pytest.raises(InvalidParameter, match="--resume='Bad/Name': must be a pipeline run's name"):
        submit(arguments(template, dry_run=True, **{**given, "resume": "Bad/Name"}))


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_resume_is_refused_while_a_training_holds_the_run_s_checkpoint_folder(
    template, monkeypatch, gcs, capsys, vertex
):
    """Two trainings in one folder would write over each other's checkpoints: while a training (here a resume of the
    run, still going) holds the folder's lease, submit --resume is refused in one line naming it, when its lease
    expires and what to do, in a dry run too; once it is released, the resume is sent."""
    from components.lib import storage
    from components.lib.lease import Lease, LeaseHeld

    folder = f"{gcs}/out/checkpoints/wikitext-base-1"
    storage.write_text_atomic(f"{folder}/checkpoint", 'model_checkpoint_path: "ckpt-3"')
    values = {"corpus": "hf:wikitext:wikitext-103-raw-v1", "output_root": f"{gcs}/out"}
    given = {"parameters": json.dumps(values), "pipeline_root": f"{gcs}/root", "resume": "wikitext-base-1"}
    sent = []
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", fake_create_pipeline_job(sent))
    where = "--project my-project --region europe-west4"
    with Lease(folder, expiry=600, run="wikitext-base-2").held():
        with pytest.raises(LeaseHeld) as refused:
            submit(arguments(template, **given), credentials=AnonymousCredentials())
        message = str(refused.value)
        assert message.startswith(
            f"--resume='wikitext-base-1': a training holds the lease on its checkpoint folder {folder}"
        )
        assert "(pipeline run wikitext-base-2: host " in message and ", expires " in message
        assert (
            f"see it with tpu-mlm status wikitext-base-2 {where}, stop it with tpu-mlm cancel wikitext-base-2"
            in message
        )
        capsys.readouterr()
        dry_run = [
            *("--template", template, "--project", "my-project", "--region", "europe-west4"),
            *("--pipeline_root", given["pipeline_root"], "--parameters", given["parameters"]),
            *("--resume", "wikitext-base-1", "--dry_run"),
        ]
        assert submit_main(dry_run) == 3  # a refusal that would come again until the training ends
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith("error: --resume='wikitext-base-1': a training holds the lease") and where in error
    # a lease whose run is no run's name (written by hand): the hint names the run resumed, never the file's text
    with Lease(folder, expiry=600, run="x; rm -rf ~").held():
        with pytest.raises(LeaseHeld) as refused:
            submit(arguments(template, **given), credentials=AnonymousCredentials())
        hint = str(refused.value).split("see it with ", 1)[1]
        assert hint.startswith(f"tpu-mlm status wikitext-base-1 {where}") and "rm -rf" not in hint
    assert not sent
    submit(arguments(template, **given, api_endpoint=vertex.url), credentials=AnonymousCredentials())
    assert len(sent) == 1


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_dry_run_of_a_resume_that_cannot_reach_the_bucket_says_so_and_shows_the_bill(template):
    """Offline (proxies and the metadata server pointed at a closed port), the dry run gives up on the checkpoint
    folder in seconds, not TensorFlow's minutes of retries, and prints the bill."""
    command = ["--template", template, "--project", "my-project", "--pipeline_root", "gs://bucket/root"]
    command += ["--parameters", '{"corpus": "embedded"}', "--corpus_bytes", "1000000", "--resume", "run-1", "--dry_run"]
    result = run_module("pipelines.submit", *command, env={**os.environ, **OFFLINE}, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "warning: gs://bucket/root/checkpoints/run-1 not read, the resume not checked: " in result.stderr
    assert "warning: a dry run lists no runs (no credentials): whether run-1 or another resume of it is still " in (
        result.stderr
    )
    assert "most it can cost" in result.stderr and "dry run: would submit" in result.stdout


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_resume_onto_checkpoints_of_another_model_or_recipe_is_refused_before_anything_runs(
    template, monkeypatch, gcs, vertex
):
    """The train step's own check of a checkpoint folder (training_plan.check_checkpoints_match, which preflight runs
    after the data steps), run at submit on what the parameters settle: another model config or recipe knob than the
    checkpoints were trained with is refused before anything is created, in a dry run too."""
    from components.lib import storage
    from components.lib.recipe import resolve_recipe
    from components.lib.training_plan import CHECKPOINT_IDENTITY_FILE, identity_before_data

    folder = f"{gcs}/out/checkpoints/wikitext-base-1"
    storage.write_text_atomic(f"{folder}/checkpoint", 'model_checkpoint_path: "ckpt-3"')
    # what the train step wrote for the run: the mini model at the default recipe, and its tokenizer
    trained = identity_before_data("mini", 25_000, 128, resolve_recipe({}))
    identity = {**trained, "tokenizer_fingerprint": "0123abcd"}
    storage.write_text_atomic(f"{folder}/{CHECKPOINT_IDENTITY_FILE}", json.dumps(identity))
    sent = []
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", fake_create_pipeline_job(sent))
    values = {"corpus": "hf:wikitext:wikitext-103-raw-v1", "output_root": f"{gcs}/out", "model_config": "mini"}

    def resume(dry_run: bool = False, **changed) -> dict:
        given = {"parameters": json.dumps({**values, **changed}), "pipeline_root": f"{gcs}/root"}
        given["api_endpoint"] = vertex.url
        return submit(arguments(template, dry_run=dry_run, resume="wikitext-base-1", **given), AnonymousCredentials())

    for dry_run in (True, False):
        with pytest.raises(
            InvalidParameter,
            match=r"--resume='wikitext-base-1': its checkpoint folder gs://.* holds "
            r"checkpoints of another model \(.*, hidden_size, .*, num_hidden_layers differ\)",
        ):
            resume(dry_run, model_config="roberta-base")
        with pytest.raises(
            InvalidParameter,
            match=r"holds checkpoints trained with other recipe knobs; resume them "
            r"with --learning_rate 0.0005",
        ):
            resume(dry_run, learning_rate=1e-3)
    assert not sent
    resume(vocab_size=30_000, max_steps=500)  # the vocabulary is the tokenizer's to settle, the steps are no knob
    assert len(sent) == 1


def test_more_parts_than_compressed_files_are_refused_before_anything_runs(template, monkeypatch, gcs):
    """A compressed file goes whole to one part: 2 .jsonl.gz files cannot make 4 parts, which the shards step would
    find out only after the tokenizer; submit lists the files and refuses first."""
    import gzip

    from components.lib import storage

    for index in range(2):
        lines = "".join(json.dumps({"text": f"line {index} {number}"}) + "\n" for number in range(50))
        with storage.open_file(f"{gcs}/corpus/part-{index}.jsonl.gz", "wb") as file:
            file.write(gzip.compress(lines.encode()))
    sent = []
    monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", fake_create_pipeline_job(sent))
    values = {"corpus": f"{gcs}/corpus/*.jsonl.gz", "num_parts": 4}
    given = {"parameters": json.dumps(values), "corpus_bytes": 10**10, "skip_quota_check": True}
    with pytest.raises(InvalidParameter, match=r"--num-parts=4: the corpus has 2 file\(s\), 2 of them compressed"):
        submit(arguments(template, **given), credentials=AnonymousCredentials())
    assert not sent
    submit(
        arguments(template, **{**given, "parameters": json.dumps({**values, "num_parts": 2})}), AnonymousCredentials()
    )
    assert len(sent) == 1
