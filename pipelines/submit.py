"""Submit a compiled pipeline to Vertex AI Pipelines.

Parameters are checked against the compiled template before anything is sent: unknown names, wrong types,
a non-``gs://`` pipeline root, malformed Hub ids and secret names fail at once. ``--dry_run`` prints the
job that would be created and touches no network. Credentials are the environment's (Application Default
Credentials: ``gcloud auth application-default login``, or the service account of the machine). ``--first_run``
submits a short run of the same pipeline on the same TPU (a sample of the corpus, 100 steps, no push), to run
between the TPU smoke test and the long run.

A submitted run is named (``--run_name``, else the display name and the time): the name finds its checkpoint
folder, its TensorBoard logs and its state (``tpu-mlm status NAME``), and ``--resume NAME`` resumes a failed run from
its checkpoints. The dry run prints the bill: every step's time and cost, the TPU job's machine, image and hard time
limit, and the most the run can cost.

    python -m pipelines.submit --template pipeline.yaml --project my-project --region us-central1 \\
        --pipeline_root gs://my-bucket/pipeline-root --service_account trainer@my-project.iam.gserviceaccount.com \\
        --corpus_bytes 546500949 --dry_run --parameters '{"corpus": "hf:wikitext:wikitext-103-raw-v1",
        "hub_repo_id": "me/roberta-wikitext", "hf_token_secret": "projects/my-project/secrets/hf-token"}'
"""

import contextlib
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from components.lib.corpus import EMBEDDED, HUB_PREFIX
from components.lib.downstream_tasks import BUILT_IN_TASKS
from components.lib.errors import InvalidParameter, ServiceFailed
from components.lib.estimates import PROBE_FINE_TUNING, probe_grids
from components.lib.hub import check_repo_id, check_secret_name
from components.lib.job_runner import log, one_line_failure, run_job
from components.lib.tpu_catalogue import TPU_TYPES
from pipelines.pipeline import check_values, peak_cpus, routed_values, step_values
from pipelines.quota import CPU_QUOTA, QuotaArguments, require_cpu_quota, require_tpu_quota
from pipelines.run_folders import (
    PIPELINE_NAME,
    RESUMED_FROM_LABEL,
    RUN_NAME,
    run_checkpoint_folder,
    run_label,
    run_name,
    run_root,
    tensorboard_folder,
)
from pipelines.vertex_jobs import JobServiceArguments, VertexProject, check_project

PARAMETER_TYPES = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": (int, float), "BOOLEAN": bool}
LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")

# What --first_run changes: a sample of the corpus in one part, shard files small enough for a slice's hosts, a
# hold-out large enough for two evaluation batches of a v5e-32 (2 x 2,048 samples: 20% of 50,000 WikiText rows is
# about 5,000 samples of 128 tokens), a few steps with a checkpoint, validation and log points on the way, and the
# TPU job's time limit derived from them (preflight's floor: 2 h), not the long run's. The evaluation and the probe
# after it run their paths on a few batches (the long run's defaults: 16 and 24 minutes on the CPU by the estimate),
# so that the estimate's run time of a first run on a v5e-8 stays within 20 minutes (most of it the CPU tasks' starts)
FIRST_RUN = {
    "limit": 50_000,
    "num_parts": 1,
    "holdout_fraction": 0.2,
    "records_per_shard": 1_000,
    "max_steps": 100,
    "checkpoint_every_steps": 50,
    "log_every_steps": 10,
    "tpu_job_timeout_hours": 0.0,
    "eval_max_batches": 2,
    "downstream_max_steps": 2,
    "downstream_max_eval_samples": 32,
    # at its first checkpoint the job exits as a preempted one does, and Vertex AI's restart resumes from it
    "rehearse_restart": True,
}
# what --first_run proves when it succeeds, which the TPU smoke test (a job of its own) does not run
FIRST_RUN_PROVES = (
    "the compiled pipeline's TPU path: KFP's executor in the TPU image, the /gcs mount it writes outputs to, the "
    "run's service account in the TPU job, the launcher, checkpoints and a restart that restores one into the "
    "TPU's variables (the train task's verdict says it resumed), the evaluation and the report"
)


@dataclass
class SubmitArguments(JobServiceArguments, QuotaArguments, VertexProject):
    pipeline_root: str = field(metadata={"help": "gs:// folder for the run's artifacts."})
    template: str = field(default="pipeline.yaml", metadata={"help": "Compiled pipeline (pipelines.compile)."})
    parameters: str = field(default="{}", metadata={"help": "Pipeline parameter values as a JSON object."})
    labels: str = field(default="", metadata={"help": "Run labels, key=value,key=value."})
    display_name: str = field(
        default="",
        metadata={"help": "The run's name in the console; default: the TPU and the parameter values given."},
    )
    run_name: str = field(
        default="",
        metadata={
            "help": "The run's id (its pipeline job's): it names the run's checkpoint and TensorBoard folders; "
            "default: tpu-mlm-YYYYMMDD-HHMMSS."
        },
    )
    resume: str = field(
        default="",
        metadata={
            "help": "A failed or stopped run's name: this run trains on from that run's checkpoints (its "
            "checkpoint_dir), with the same parameters (the checkpoints refuse another recipe)."
        },
    )
    enable_caching: bool | None = field(
        default=None,
        metadata={
            "help": "Unset: each step as compiled (tokenizer, shards, evaluation and report reuse unchanged results; "
            "preflight, training and the push always run). true: every step reuses; false: none does."
        },
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "Print the bill (every step's time and cost, the TPU job and its limit, the most the run can "
            "cost) and the job, instead of submitting it; reads nothing over the network."
        },
    )
    corpus_bytes: int = field(
        default=0,
        metadata={
            "help": "The corpus's size as stored (compressed files: their compressed size), for the estimate of an "
            "hf: corpus (its dataset card) or, in a dry run, of files (gcloud storage du -s)."
        },
    )
    first_run: bool = field(
        default=False,
        metadata={
            "help": "A short run of the same compiled pipeline on the same TPU first: a sample of the corpus, "
            f"{FIRST_RUN['max_steps']} training steps, the run's own checkpoint folder and no Hub push (unless "
            "--first_run_push); it proves the pipeline's TPU path in minutes before the long run pays for hours."
        },
    )
    first_run_push: bool = field(
        default=False, metadata={"help": "With --first_run: push to hub_repo_id too (to test the token's access)."}
    )
    follow: bool = field(
        default=False,
        metadata={"help": "Once submitted, a line at each change of the run (tpu-mlm status --follow) until it ends."},
    )
    experiment: str = field(
        default="",
        metadata={
            "help": "A Vertex AI Experiment to add the run to: its parameters and metrics beside other runs' there."
        },
    )


def first_run_values(values: dict[str, Any], push: bool) -> dict[str, Any]:
    """The parameter values of a first run: ``FIRST_RUN`` over the long run's, in the run's own checkpoint folder
    (the long run's must not resume a 100-step schedule), and without the push unless ``push``."""
    changed = {**values, **FIRST_RUN}
    # each model's probe at one rate, its grid's first: two steps choose nothing, and a grid's fine-tunings would
    # put the estimate's run time over its 20 minutes (the search's code is the CPU's, run by make run and the tests)
    rates, random_init_rates = (
        values.get(f"downstream_{name}", PROBE_FINE_TUNING[name])
        for name in ("learning_rates", "random_init_learning_rates")
    )
    grids = probe_grids(str(rates), str(random_init_rates))
    changed["downstream_learning_rates"] = f"{grids[0][0]:g}"
    if str(random_init_rates).strip():
        changed["downstream_random_init_learning_rates"] = f"{grids[1][0]:g}"
    dropped = ["checkpoint_dir"] + ([] if push else ["hub_repo_id"])
    for name in dropped:
        if changed.pop(name, None):
            log.info("first run: without the long run's %s", name)
    return changed


# what the default display name leaves out of the values given: secrets' names, the Hub repository, folders
NOT_IN_DISPLAY_NAMES = ("hf_token_secret", "hub_repo_id", "output_root", "checkpoint_dir")
DISPLAY_NAME_LENGTH = 128  # Vertex AI's longest
FIRST_RUN_SUFFIX = " (first run)"


def run_display_name(given: str, tpu_type: str, values: dict[str, Any], suffix: str = "") -> str:
    """The run's display name, ``suffix`` included, within Vertex AI's 128 characters: the name given (refused when
    too long: cutting it would hide what its owner wrote), else by what differs from the template's defaults: the
    TPU and the values given, so that two runs tell apart in the console's list (cut to fit)."""
    room = DISPLAY_NAME_LENGTH - len(suffix)
    if len(given) > room:
        raise InvalidParameter(
            "display_name",
            given,
            f"is {len(given)} characters; Vertex AI takes {DISPLAY_NAME_LENGTH}"
            + (f", and {suffix.strip()!r} takes {len(suffix)} of them: at most {room}" if suffix else ""),
        )
    shown = [f"{name}={value}" for name, value in values.items() if name not in NOT_IN_DISPLAY_NAMES]
    return (given or " ".join([f"tpu-mlm {tpu_type}", *shown])[:room]) + suffix


def resumed_values(values: dict[str, Any], pipeline_root: str, resume: str) -> dict[str, Any]:
    """The values of a run that trains on from run ``resume``'s checkpoints: its checkpoint folder as
    ``checkpoint_dir`` (a folder given is the one to resume from)."""
    folder = run_checkpoint_folder(
        {"output_root": values.get("output_root")}, pipeline_root, run_name(resume, "resume")
    )
    if values.get("checkpoint_dir") and values["checkpoint_dir"] != folder:
        raise InvalidParameter(
            "resume",
            resume,
            f"its checkpoints are in {folder}, and checkpoint_dir names {values['checkpoint_dir']}: a run with a fixed "
            "checkpoint_dir resumes there when submitted again with the same parameters (no --resume)",
        )
    return {**values, "checkpoint_dir": folder}


def check_service_account(service_account: str, otherwise: str) -> None:
    """A service account's email, or none: then a warning says who acts instead (``otherwise``), with other
    roles than the ones the README grants the run's account."""
    if not service_account:
        log.warning("no --service_account: %s, not the run's account with the README's roles", otherwise)
    elif not re.fullmatch(r"[^@\s]+@[^@\s]+\.gserviceaccount\.com", service_account):
        raise InvalidParameter(
            "service_account",
            service_account,
            "must be a service account's email (NAME@PROJECT.iam.gserviceaccount.com)",
        )


def check_parameters(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` checked against the template's parameters: names, types and the values the pipeline would
    otherwise reject only when a step runs."""
    known = template["root"]["inputDefinitions"]["parameters"]
    for name, value in values.items():
        if name not in known:
            raise InvalidParameter("parameters", name, f"is not a parameter of this pipeline; known: {sorted(known)}")
        expected = PARAMETER_TYPES[known[name]["parameterType"]]
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise InvalidParameter(name, value, f"must be of type {known[name]['parameterType'].lower()}")
    if values.get("hub_repo_id"):
        check_repo_id("hub_repo_id", values["hub_repo_id"])
        if not values.get("hf_token_secret"):
            raise InvalidParameter(
                "hf_token_secret", "", "a Hub push on Vertex AI reads its token from a Secret Manager secret; name it"
            )
    if values.get("hf_token_secret"):
        check_secret_name(values["hf_token_secret"])
    check_reachable_on_vertex(values)
    tpu = TPU_TYPES[template_tpu_type(template)]
    if values.get("replicas", 0) not in (0, tpu.replicas):
        raise InvalidParameter(
            "replicas", values["replicas"], f"a {tpu.name} has {tpu.replicas}; leave it at the template's"
        )
    check_values(values)  # every step's own checks, before a run is created
    return values


def template_tpu_type(template: dict[str, Any]) -> str:
    """The TPU type the template was compiled for (preflight's constant)."""
    return template["root"]["dag"]["tasks"]["preflight-step"]["inputs"]["parameters"]["tpu_type"]["runtimeValue"][
        "constant"
    ]


def check_reachable_on_vertex(values: dict[str, Any]) -> None:
    """The steps on Vertex AI read and write buckets, Hub datasets and models and the embedded corpus; this machine's
    folders are not there."""
    for name in ("corpus", "validation_corpus", "output_root", "checkpoint_dir", "init_from"):
        for item in str(values.get(name, "")).split(","):
            item = item.strip()
            off_machine = (name.endswith("corpus") and item == EMBEDDED) or (
                name in ("corpus", "validation_corpus", "init_from") and item.startswith(HUB_PREFIX)
            )
            if item and not off_machine and not item.startswith("gs://"):
                raise InvalidParameter(
                    name,
                    values[name],
                    "is a path on this machine, which the steps on Vertex AI cannot reach: copy it to a bucket "
                    "(gcloud storage cp) and name its gs:// URI"
                    + (", or use an hf: dataset or 'embedded'" if name.endswith("corpus") else "")
                    + (", or name an hf: model" if name == "init_from" else ""),
                )
    for task in str(values.get("downstream_tasks", "")).split(","):
        task = task.strip()
        if task and task not in BUILT_IN_TASKS and not task.startswith((HUB_PREFIX, "gs://")):
            raise InvalidParameter(
                "downstream_tasks",
                values["downstream_tasks"],
                f"{task!r} is a path on this machine, which the probe on Vertex AI cannot reach: copy its train and "
                f"validation files to a bucket and name its gs:// folder, or use an hf: dataset or "
                f"{', '.join(BUILT_IN_TASKS)}",
            )


def parse_labels(labels: str) -> dict[str, str]:
    pairs = dict(item.split("=", 1) for item in labels.split(",") if "=" in item)
    if labels.strip() and len(pairs) != len([item for item in labels.split(",") if item.strip()]):
        raise InvalidParameter("labels", labels, "must be key=value pairs separated by commas")
    for key, value in pairs.items():
        if not LABEL.match(key) or not re.fullmatch(r"[a-z0-9_-]{0,63}", value):
            raise InvalidParameter("labels", labels, "keys and values: lowercase letters, digits, '_' and '-'")
    return pairs


def build_job(arguments: SubmitArguments, credentials: Any = None) -> Any:
    """The ``aiplatform.PipelineJob`` for the arguments, after every check (no network is used)."""
    from google.cloud import aiplatform

    if arguments.api_endpoint:  # another endpoint than the region's, over REST as vertex_jobs's clients
        aiplatform.init(api_endpoint=arguments.api_endpoint, api_transport="rest")
        if arguments.api_endpoint.startswith("http://"):  # a local stand-in, reached without credentials
            from google.auth.credentials import AnonymousCredentials

            credentials = credentials or AnonymousCredentials()
    if arguments.experiment and not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,127}", arguments.experiment):
        raise InvalidParameter(
            "experiment", arguments.experiment, "must be an experiment's name: lowercase letters, digits and '-'"
        )

    if not arguments.pipeline_root.startswith("gs://"):
        raise InvalidParameter("pipeline_root", arguments.pipeline_root, "must be a gs:// URI on Vertex AI")
    check_project(arguments.project)
    check_service_account(arguments.service_account, "the run acts as the project's Compute Engine default account")
    if not Path(arguments.template).is_file():
        raise InvalidParameter("template", arguments.template, "no such file; compile it with tpu-mlm compile")
    try:
        values = json.loads(arguments.parameters)
    except json.JSONDecodeError as error:
        raise InvalidParameter("parameters", arguments.parameters, f"is not a JSON object: {error}") from error
    if not isinstance(values, dict):
        raise InvalidParameter("parameters", arguments.parameters, "must be a JSON object of name: value")
    template = yaml.safe_load(Path(arguments.template).read_text())
    if arguments.first_run_push and not arguments.first_run:
        raise InvalidParameter("first_run_push", True, "is for --first_run")
    if arguments.resume and arguments.first_run:
        raise InvalidParameter("resume", arguments.resume, "a first run trains in its own checkpoint folder")
    labels = parse_labels(arguments.labels)
    given = values
    name = (
        run_name(arguments.run_name, "run_name")
        if arguments.run_name
        else f"tpu-mlm-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    )
    if arguments.first_run:
        values = first_run_values(values, arguments.first_run_push)
        given = {key: values[key] for key in given if key in values}  # as the first run uses them: num_parts=1
        labels, name = {**labels, "tpu-mlm-kind": "first-run"}, f"{name}-first-run"
    display_name = run_display_name(
        arguments.display_name, template_tpu_type(template), given, FIRST_RUN_SUFFIX if arguments.first_run else ""
    )
    if arguments.resume:
        values = resumed_values(values, arguments.pipeline_root, arguments.resume)
        # what tells clean that this run trains in the other's checkpoints (and not in a fixed checkpoint_dir)
        labels = {**labels, RESUMED_FROM_LABEL: run_label(arguments.resume)}
    check_parameters(template, values)
    # only when asked: aiplatform's enable_caching overrides every task's compiled setting, training's included
    caching = {} if arguments.enable_caching is None else {"enable_caching": arguments.enable_caching}
    return aiplatform.PipelineJob(
        job_id=name,
        display_name=display_name,
        template_path=arguments.template,
        pipeline_root=arguments.pipeline_root,
        parameter_values=values,
        **caching,
        labels=labels,
        project=arguments.project,
        location=arguments.region,
        credentials=credentials,
    )


def check_estimate(arguments: SubmitArguments, request: dict[str, Any], values: dict[str, Any]) -> dict[str, Any] | str:
    """The run's estimate from its parameters (the template's defaults, then the values given), and its bill: the
    TPU job as the template runs it, its hard time limit and the most the run can cost, printed as a table; a run
    that cannot train (a batch larger than the data, memory preflight would refuse) is refused here, before
    anything is sent. Where the corpus's size is not known here, the reason instead. A dry run reads nothing."""
    from components.lib.estimates import EstimateArguments, check_memory_fit, estimate_run, estimate_table

    spec = request["pipelineSpec"]
    tpu = template_tpu_type(spec)
    try:
        settings = routed_values(values, EstimateArguments, skip_steps=("downstream", "evaluate"))
        if values["validation_corpus"]:  # the shards hold nothing of the corpus out
            settings["holdout_fraction"] = 0.0
        estimated = EstimateArguments(
            **settings, corpus_bytes=arguments.corpus_bytes, tpu_type=tpu, offline=arguments.dry_run
        )
        result = estimate_run(
            estimated, probe=step_values(values, "downstream"), evaluation=step_values(values, "evaluate")
        )
    except InvalidParameter as error:
        if error.parameter != "corpus_bytes":
            raise
        print(f"warning: no estimate of the run: {error}", file=sys.stderr)
        return f"no estimate: {error}"
    except Exception as error:  # the corpus's bucket, unreachable from here: the estimate is advice
        print(f"warning: no estimate of the run: {type(error).__name__}: {error}", file=sys.stderr)
        return f"no estimate: {error}"
    check_memory_fit(result["memory"], result["per_replica_batch_size"])
    result["bill"] = run_bill(spec, values, result)
    print(
        f"Estimate of the run on a {tpu} (before the data exists):\n{estimate_table(result)}\n{bill_table(result)}",
        file=sys.stderr,
    )
    return result


def check_parts(values: dict[str, Any]) -> None:
    """Refuses, before anything runs, ``num_parts`` that the corpus's files cannot be cut into (a compressed file
    goes whole to one part): the shards step would refuse them only after the tokenizer. Lists the files only."""
    corpus = str(values["corpus"]).strip()
    if int(values["num_parts"]) > 1 and corpus != EMBEDDED and not corpus.startswith(HUB_PREFIX):
        from components.lib.corpus import Corpus, CorpusSpec

        Corpus(CorpusSpec(corpus=corpus)).reader.describe_part(int(values["num_parts"]), 0)


def run_values(request: dict[str, Any]) -> dict[str, Any]:
    """Every pipeline parameter's value in the run (``request``, the job as a dict): the template's defaults, then
    the values given."""
    parameters = request["pipelineSpec"]["root"]["inputDefinitions"]["parameters"]
    defaults = {name: parameter.get("defaultValue") for name, parameter in parameters.items()}
    return {**defaults, **request["runtimeConfig"].get("parameterValues", {})}


def run_bill(spec: dict[str, Any], values: dict[str, Any], estimate: dict[str, Any]) -> dict[str, Any]:
    """The TPU job as the compiled template ``spec`` creates it (machine, image, provisioning), its hard time limit
    (preflight's rule, from the estimate) and the most the run can cost: the TPU at its price for the whole limit
    (the jobs of the train task share it), plus the CPU steps' estimate (they have no limit of their own)."""
    from components.lib.estimates import tpu_job_timeout

    tpu = TPU_TYPES[template_tpu_type(spec)]
    parameters = spec["components"]["comp-train-step"]["inputDefinitions"]["parameters"]
    pool = parameters["worker_pool_specs"]["defaultValue"][0]
    provisioning = values["tpu_provisioning"]
    price = float(values["tpu_price_per_hour"]) or tpu.list_price(provisioning)
    limit_hours = tpu_job_timeout(float(values["tpu_job_timeout_hours"]), estimate["hours"]) / 3600
    cpu_cost = sum(step["cost"] for step in estimate["cpu_steps"] if step["cost"] is not None)
    return {
        "machine_spec": pool["machine_spec"],
        "hosts": tpu.hosts,
        "image": pool["container_spec"]["image_uri"],
        "provisioning": provisioning,
        "price_per_hour": price,
        "price_source": "tpu_price_per_hour"
        if float(values["tpu_price_per_hour"])
        else tpu.list_price_source(provisioning),
        "expected_tpu_cost": estimate["hours"] * price,
        "time_limit_hours": limit_hours,
        "tpu_worst_cost": limit_hours * price,
        "cpu_cost": cpu_cost,
        "worst_cost": limit_hours * price + cpu_cost,
        "limit": int(values["limit"]),
        "peak_cpus": peak_cpus(int(values["num_parts"])),
    }


def bill_table(estimate: dict[str, Any]) -> str:
    from components.lib.estimates import two_columns

    bill = estimate["bill"]
    machine = ", ".join(f"{key} {value}" for key, value in bill["machine_spec"].items())
    hosts = f", {bill['hosts']} hosts" if bill["hosts"] > 1 else ""
    rows = [
        ("TPU job", f"{machine}{hosts}, {bill['provisioning']}, image {bill['image']}"),
        ("TPU price", f"${bill['price_per_hour']:,.2f} an hour ({bill['price_source']})"),
        (
            "TPU time limit",
            f"{bill['time_limit_hours']:,.1f} h (tpu_job_timeout_hours; 0: twice the estimate plus an hour): the job "
            "is stopped there, checkpoints kept",
        ),
        (
            "expected cost",
            f"${bill['expected_tpu_cost'] + bill['cpu_cost']:,.2f} (TPU ${bill['expected_tpu_cost']:,.2f} at the "
            f"assumed MFU, CPU steps ${bill['cpu_cost']:,.2f})",
        ),
        (
            "most it can cost",
            f"${bill['worst_cost']:,.2f}: the TPU for its whole time limit (${bill['tpu_worst_cost']:,.2f}, shared by "
            f"the train task's retries) and the CPU steps' estimate (${bill['cpu_cost']:,.2f}, no limit of their own); "
            "not counted: the launcher's small CPU machine, up while the TPU job waits and runs",
        ),
        (
            "CPUs at once",
            f'{bill["peak_cpus"][1]} vCPUs ({bill["peak_cpus"][0]}): the region\'s quota "{CPU_QUOTA.display_name}" '
            "must hold them (submit reads it before anything is created, a dry run does not)",
        ),
    ]
    if bill["limit"] and "text_bytes" in estimate["data"]:  # a sample (a first run's): its texts' length assumed
        rows.append(
            (
                "limit",
                f"at most {bill['limit']:,} texts a part are read: the data steps above count them at "
                f"{estimate['data']['text_bytes']:,.0f} bytes a text (see data); texts longer than that (whole "
                "documents) make the sample and those steps longer in proportion",
            )
        )
    return two_columns(rows)


def run_folders(arguments: SubmitArguments, request: dict[str, Any]) -> dict[str, str]:
    """Where the run keeps its checkpoints and TensorBoard logs, and the commands that follow it, by its name."""
    name = request["name"].rsplit("/", 1)[-1]
    values = request["runtimeConfig"].get("parameterValues", {})
    where = f"--project {arguments.project} --region {arguments.region}"
    logs = tensorboard_folder(run_root(values, arguments.pipeline_root), "")
    return {
        "run": name,
        "checkpoints": run_checkpoint_folder(values, arguments.pipeline_root, name),
        "tensorboard": f"tensorboard --logdir {shlex.quote(logs)}  (this run: {name})",
        "status": f"tpu-mlm status {name} {where}",
        "cancel": f"tpu-mlm cancel {name} {where}",
        "resume": resume_hint(values, name),
    }


def resume_hint(values: dict[str, Any], name: str) -> str:
    """How this run, failed, trains on: in its fixed checkpoint_dir by submitting again, else by --resume."""
    if values.get("checkpoint_dir"):
        return f"if it fails, submit again with the same parameters: it resumes in {values['checkpoint_dir']}"
    return f"if it fails, tpu-mlm submit ... --resume {name} (the same parameters; a run name is used once)"


def check_resumable(folder: str) -> None:
    """Refuses a resume from a folder that holds no checkpoint (a misspelt run name, another root)."""
    from components.lib import storage

    if not storage.exists(storage.join(folder, "checkpoint")):
        raise InvalidParameter("resume", folder, "holds no checkpoint: name a run that trained, under this root")


def check_resume(arguments: SubmitArguments, values: dict[str, Any]) -> None:
    """Refuses, before anything is created, a resume that cannot train on in its run's checkpoint folder
    (``values["checkpoint_dir"]``): one that holds no checkpoint, one a training holds the lease of (alive: a second
    would write over its checkpoints), and one whose model or recipe differs from the checkpoints' (the train step's
    and preflight's own check, on what the parameters settle before the data steps run). A dry run checks what it
    can read: a folder it cannot reach (no credentials, no network) is said in a warning, not refused."""
    from components.lib.errors import Refused

    folder = values["checkpoint_dir"]
    try:
        with few_storage_retries(arguments.dry_run):
            check_resumable(folder)
            check_not_leased(arguments, folder)
            check_same_training(arguments.resume, folder, values)
    except (InvalidParameter, Refused):
        raise
    except Exception as error:
        if not arguments.dry_run:
            raise
        print(f"warning: {folder} not read, the resume not checked: {error_line(error)}", file=sys.stderr)


# TensorFlow's retries of a Cloud Storage request, where this process first reaches a bucket (its gs:// file system
# reads them then): its default, 10 with a backoff of up to 32 s, waits minutes on a bucket that cannot be reached
STORAGE_RETRIES_VARIABLE = "GCS_RETRY_CONFIG_MAX_RETRIES"
DRY_RUN_STORAGE_RETRIES = "2"


@contextlib.contextmanager
def few_storage_retries(dry_run: bool) -> Iterator[None]:
    """In a dry run, a bucket that cannot be reached (no network, no credentials) is given up on in seconds."""
    if not dry_run or STORAGE_RETRIES_VARIABLE in os.environ:
        yield
        return
    os.environ[STORAGE_RETRIES_VARIABLE] = DRY_RUN_STORAGE_RETRIES
    try:
        yield
    finally:
        del os.environ[STORAGE_RETRIES_VARIABLE]


def check_not_leased(arguments: SubmitArguments, folder: str) -> None:
    """Refuses while a training holds the folder's lease (``components/lib/lease.py``), naming it and what to do."""
    from components.lib.lease import LeaseHeld, describe, live_lease

    lease = live_lease(folder)
    if lease is None:
        return
    # the lease's run as a name submit writes, else the run resumed: a lease file's text never reaches the hint raw
    written = str(lease.get("run") or "")
    holder = shlex.quote(written if RUN_NAME.fullmatch(written) else arguments.resume)
    where = shlex.join(["--project", arguments.project, "--region", arguments.region])
    raise LeaseHeld(
        f"--resume={arguments.resume!r}: a training holds the lease on its checkpoint folder {folder} "
        f"({describe(lease)}) and a second would write over its checkpoints: see it with tpu-mlm status {holder} "
        f"{where}, stop it with tpu-mlm cancel {holder} {where}, or wait until it ends or its lease expires, then "
        "submit again"
    )


def check_no_run_going(arguments: SubmitArguments, credentials: Any = None) -> None:
    """Refuses a resume while the run it resumes, or another resume of it (labelled ``RESUMED_FROM_LABEL``), has not
    ended: queued or pending, that run's training has not taken the folder's lease yet (``check_not_leased`` sees
    none), and both would train in the folder. Reads this pipeline's runs in the region, each with its state and
    labels. Two resumes submitted at the same moment can still both pass (each lists before the other is created):
    the later training's start is then refused by the lease."""
    from components.lib.errors import Refused
    from pipelines.vertex_jobs import PIPELINE_TERMINAL_STATES, call, location_path, pipeline_client

    resumed = run_name(arguments.resume, "resume")
    client = pipeline_client(arguments.region, arguments.api_endpoint, credentials)
    request = {
        "parent": location_path(arguments.project, arguments.region),
        "filter": f'pipeline_name="{PIPELINE_NAME}"',
    }
    jobs = list(call(client.list_pipeline_jobs, request=request))
    if resumed not in {job.name.rsplit("/", 1)[-1] for job in jobs}:
        # a resume in another region than its run's: neither this check nor clean there would see the other
        raise InvalidParameter(
            "resume",
            arguments.resume,
            f"no run of {PIPELINE_NAME} of that name in project {arguments.project}, region {arguments.region}: "
            "resume a run in its own region (--region)",
        )
    for job in jobs:
        name, state = job.name.rsplit("/", 1)[-1], job.state.name
        if state in PIPELINE_TERMINAL_STATES:
            continue
        if name == resumed:
            what = f"the run {name} is {state}: it trains in its checkpoint folder"
        elif job.labels.get(RESUMED_FROM_LABEL) == run_label(resumed):
            what = f"{name}, a resume of it, is {state}: it trains in the run's checkpoint folder"
        else:
            continue
        where = f"--project {arguments.project} --region {arguments.region}"
        raise Refused(
            f"--resume={arguments.resume!r}: {what}, and a second training would write over its checkpoints: see it "
            f"with tpu-mlm status {name} {where}, stop it with tpu-mlm cancel {name} {where}, or wait until it ends, "
            "then submit again"
        )


def check_same_training(resume: str, folder: str, values: dict[str, Any]) -> None:
    """Refuses a resume whose model config or recipe differs from what the folder's checkpoints were trained with:
    ``check_checkpoints_match``, which preflight and the train step run once the data exists, on the identity the
    parameters settle (``identity_before_data``)."""
    from components.lib.recipe import resolve_recipe
    from components.lib.training_plan import TrainingSettings, check_checkpoints_match, identity_before_data
    from pipelines.steps import STEPS

    train = routed_values(values, TrainingSettings, skip_steps=tuple(step for step in STEPS if step != "train"))
    vocab_size = int(step_values(values, "tokenizer")["vocab_size"])
    max_length = int(step_values(values, "shards")["max_length"])
    identity = identity_before_data(train["model_config"], vocab_size, max_length, resolve_recipe(train))
    if train["init_from"]:  # the architecture is the base model's, which preflight reads: its source is settled
        identity["model_config"], identity["init_from"] = {}, train["init_from"]
    try:
        check_checkpoints_match(folder, identity)
    except InvalidParameter as error:
        raise InvalidParameter("resume", resume, f"its checkpoint folder {folder} {error.expected}") from None


def submit(arguments: SubmitArguments, credentials: Any = None) -> dict[str, Any]:
    if arguments.dry_run:
        from google.auth.credentials import AnonymousCredentials

        credentials = credentials or AnonymousCredentials()
    job = build_job(arguments, credentials)
    request = job.to_dict()  # once: it serializes the whole pipeline spec
    values = run_values(request)
    if arguments.resume:
        check_resume(arguments, values)
    if arguments.resume and arguments.dry_run:
        print(
            f"warning: a dry run lists no runs (no credentials): whether {arguments.resume} or another resume of it "
            "is still queued or running is not checked here; submit checks it before it creates the run",
            file=sys.stderr,
        )
    if arguments.dry_run:
        estimate = check_estimate(arguments, request, values)
        tasks = sorted(request["pipelineSpec"]["root"]["dag"]["tasks"])
        request["pipelineSpec"] = f"{arguments.template} ({len(tasks)} tasks: {', '.join(tasks)})"
        request["serviceAccount"] = arguments.service_account
        request["name"] = job.job_id
        summary = {"dry_run": True, "would_submit": request, "estimate": estimate}
    else:
        estimate = check_estimate(arguments, request, values)
        check_parts(values)
        tpu = TPU_TYPES[template_tpu_type(request["pipelineSpec"])]
        require_tpu_quota(arguments, arguments.project, arguments.region, tpu, values["tpu_provisioning"])
        require_cpu_quota(arguments, arguments.project, arguments.region, int(values["num_parts"]))
        if arguments.resume:  # last before anything is created: the runs listed stay as near as can be to now
            check_no_run_going(arguments, credentials)
        checked_experiment(job, arguments.experiment)
        job.submit(service_account=arguments.service_account or None)  # the run exists from here: never twice
        request["name"] = job.resource_name
        summary = {"job": job.resource_name, "console": job._dashboard_uri()}
    summary["follow"] = run_folders(arguments, request)
    if arguments.first_run:  # a short run to prove the path: run it again, not on
        del summary["follow"]["resume"]
    if arguments.experiment and not arguments.dry_run:
        print(summary_for_people(summary), flush=True)  # the run's name and commands, before the link can fail
        summary["experiment"] = add_to_experiment(job, arguments.experiment)
    if arguments.follow and not arguments.dry_run:
        from pipelines.runs import StatusArguments, status

        where = {"project": arguments.project, "region": arguments.region, "api_endpoint": arguments.api_endpoint}
        followed = StatusArguments(
            run=summary["follow"]["run"], follow=True, poll_seconds=arguments.poll_seconds, **where
        )
        print(summary_for_people(summary), flush=True)  # what was submitted (or linked), before the lines that follow
        summary["status"] = status(followed, reached=True)
    if arguments.first_run:
        summary["first_run"] = (
            f"{FIRST_RUN['max_steps']} steps on a sample{first_run_time(estimate)}; when it succeeds it proves "
            f"{FIRST_RUN_PROVES}; it does not run {first_run_leaves(json.loads(arguments.parameters), arguments)}"
        )
    return summary


def first_run_leaves(long_run: dict[str, Any], arguments: SubmitArguments) -> str:
    """What the long run (its values as given) does that its first run does not."""
    left = []
    if int(long_run.get("num_parts", 1)) > 1:
        left.append(f"the data steps' {long_run['num_parts']} parts side by side (it reads a sample in one)")
    if long_run.get("hub_repo_id") and not arguments.first_run_push:
        left.append("the Hub push (--first_run_push tries it)")
    full_size = "the evaluation and the probe at their full size (the probe's choice of rates among it)"
    return ", ".join([*left, f"{full_size}, or a preemption in a new job"])


def first_run_time(estimate: dict[str, Any] | str) -> str:
    """How long the first run takes by its estimate (its run time row), or nothing where there is none."""
    from components.lib.estimates import RUN_TIME_BASIS, run_hours

    if not isinstance(estimate, dict):
        return ""
    return (
        f", about {run_hours(estimate) * 60:.0f} min from submit to the end ({RUN_TIME_BASIS}; the TPU job's start "
        "and compile, twice with the rehearsed restart, and any queue come on top)"
    )


def checked_experiment(job: Any, experiment: str) -> None:
    """The experiment found, or made, before the run is created (aiplatform's own check of
    ``PipelineJob.submit(experiment=...)``, whose link comes after the run exists: ``add_to_experiment``). A failure
    is one line, and no run is submitted."""
    if not experiment:
        return
    try:
        job._validate_experiment(experiment)
    except (RuntimeError, ValueError) as error:
        raise ServiceFailed(f"experiment {experiment}: {error_line(error)}; no run was submitted") from None


def add_to_experiment(job: Any, experiment: str) -> str:
    """Makes the submitted run one of the experiment's runs (aiplatform's link, the second half of
    ``PipelineJob.submit(experiment=...)``); what the summary says of it. A failure is a line, not an error: the run
    exists and goes on, and submitting it again would pay for a second run."""
    try:
        job._associate_to_experiment(experiment)
    except Exception as error:
        return f"not added to {experiment} ({error_line(error)}); the run goes on without it: do not submit it again"
    return experiment


def error_line(error: BaseException) -> str:
    """One line for an error aiplatform wraps (its cause's: a refusal by Google Cloud as job_runner says it)."""
    cause = error.__cause__ or error
    failure = one_line_failure(cause)
    return failure[1] if failure else " ".join(f"{type(cause).__name__}: {cause}".split())


def summary_for_people(summary: dict[str, Any]) -> str:
    """What was (or would be) submitted and what follows it; a followed run's final status instead, and for a run
    in an experiment whether it was added (what was submitted was printed before the link and the following)."""
    if "status" in summary:
        from pipelines.runs import status_lines

        return status_lines(summary["status"])
    first_run = f"\nfirst run: {summary['first_run']}" if "first_run" in summary else ""
    if "experiment" in summary:
        return f"experiment:  {summary['experiment']}{first_run}"
    follow = "\n".join(f"{key + ':':<13}{value}" for key, value in summary["follow"].items())
    if summary.get("dry_run"):
        request = summary["would_submit"]
        return (
            f"dry run: would submit {request['displayName']!r} with "
            f"{len(request['runtimeConfig'].get('parameterValues', {}))} "
            f"parameter values, root {request['runtimeConfig']['gcsOutputDirectory']} (--json prints the request)\n"
            + follow
            + first_run
        )
    return f"submitted {summary['job']}\nconsole:     {summary['console']}\n{follow}{first_run}"


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(SubmitArguments, submit, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
