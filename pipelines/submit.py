"""Submit a compiled pipeline to Vertex AI Pipelines.

Parameters are checked against the compiled template before anything is sent: unknown names, wrong types,
a non-``gs://`` pipeline root, malformed Hub ids and secret names fail at once. ``--dry_run`` prints the
job that would be created and touches no network. Credentials are the environment's (Application Default
Credentials: ``gcloud auth application-default login``, or the service account of the machine). ``--first_run``
submits a short run of the same pipeline on the same TPU (a sample of the corpus, 100 steps, no push), to run
between the TPU smoke test and the long run.

    python -m pipelines.submit --template pipeline.yaml --project my-project --region us-central1 \\
        --pipeline_root gs://my-bucket/pipeline-root --service_account trainer@my-project.iam.gserviceaccount.com \\
        --parameters '{"corpus": "hf:wikitext:wikitext-103-raw-v1", "hub_repo_id": "me/roberta-wikitext"}'
"""

import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from components.lib.corpus import EMBEDDED, HUB_PREFIX
from components.lib.errors import InvalidParameter
from components.lib.hub import check_repo_id, check_secret_name
from components.lib.job_runner import log, run_job
from components.lib.tpu_catalogue import TPU_TYPES
from pipelines.pipeline import check_values, routed_values, step_values
from pipelines.vertex_jobs import VertexProject

PARAMETER_TYPES = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": (int, float), "BOOLEAN": bool}
LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")

# What --first_run changes: a sample of the corpus in one part, shard files small enough for a slice's hosts, a
# hold-out large enough for two evaluation batches of a v5e-32 (2 x 2,048 samples: 20% of 50,000 WikiText rows is
# about 5,000 samples of 128 tokens), a few steps with a checkpoint, validation and log points on the way, and the
# TPU job's time limit derived from them (preflight's floor: 2 h), not the long run's
FIRST_RUN = {
    "limit": 50_000,
    "num_parts": 1,
    "holdout_fraction": 0.2,
    "records_per_shard": 1_000,
    "max_steps": 100,
    "checkpoint_every_steps": 50,
    "log_every_steps": 10,
    "tpu_job_timeout_hours": 0.0,
}
# what --first_run proves when it succeeds, which the TPU smoke test (a job of its own) does not run
FIRST_RUN_PROVES = (
    "the compiled pipeline's TPU path: KFP's executor in the TPU image, the /gcs mount it writes outputs to, the "
    "run's service account in the TPU job, the launcher, checkpoints, the evaluation and the report"
)


@dataclass
class SubmitArguments(VertexProject):
    pipeline_root: str = field(metadata={"help": "gs:// folder for the run's artifacts."})
    template: str = field(default="pipeline.yaml", metadata={"help": "Compiled pipeline (pipelines.compile)."})
    parameters: str = field(default="{}", metadata={"help": "Pipeline parameter values as a JSON object."})
    labels: str = field(default="", metadata={"help": "Run labels, key=value,key=value."})
    display_name: str = field(default="tpu-mlm-pretraining", metadata={"help": "Name of the run."})
    enable_caching: bool | None = field(
        default=None,
        metadata={
            "help": "Unset: each step as compiled (tokenizer, shards, evaluation and report reuse unchanged results; "
            "preflight, training and the push always run). true: every step reuses; false: none does."
        },
    )
    dry_run: bool = field(
        default=False, metadata={"help": "Print the job, and an estimate of the TPU run, instead of submitting it."}
    )
    corpus_bytes: int = field(
        default=0, metadata={"help": "The corpus's size, for the dry run's estimate of an hf: corpus (dataset card)."}
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


def first_run_values(values: dict[str, Any], push: bool) -> dict[str, Any]:
    """The parameter values of a first run: ``FIRST_RUN`` over the long run's, in the run's own checkpoint folder
    (the long run's must not resume a 100-step schedule), and without the push unless ``push``."""
    changed = {**values, **FIRST_RUN}
    dropped = ["checkpoint_dir"] + ([] if push else ["hub_repo_id"])
    for name in dropped:
        if changed.pop(name, None):
            log.info("first run: without the long run's %s", name)
    return changed


def check_project(project: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", project):
        raise InvalidParameter(
            "project", project, "is not a Google Cloud project id (6-30 lowercase letters, digits and hyphens)"
        )


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
    """The steps on Vertex AI read and write buckets, Hub datasets and the embedded corpus; this machine's
    folders are not there."""
    for name in ("corpus", "validation_corpus", "output_root", "checkpoint_dir"):
        for item in str(values.get(name, "")).split(","):
            item = item.strip()
            corpus = name.endswith("corpus") and (item == EMBEDDED or item.startswith(HUB_PREFIX))
            if item and not corpus and not item.startswith("gs://"):
                raise InvalidParameter(
                    name,
                    values[name],
                    "is a path on this machine, which the steps on Vertex AI cannot reach: copy it to a bucket "
                    "(gcloud storage cp) and name its gs:// URI"
                    + (", or use an hf: dataset or 'embedded'" if name.endswith("corpus") else ""),
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
    labels, display_name = parse_labels(arguments.labels), arguments.display_name
    if arguments.first_run:
        values = first_run_values(values, arguments.first_run_push)
        labels, display_name = {**labels, "tpu-mlm-run": "first-run"}, f"{display_name}-first-run"
    check_parameters(template, values)
    # only when asked: aiplatform's enable_caching overrides every task's compiled setting, training's included
    caching = {} if arguments.enable_caching is None else {"enable_caching": arguments.enable_caching}
    return aiplatform.PipelineJob(
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


def check_estimate(arguments: SubmitArguments, job: Any) -> dict[str, Any] | str:
    """The estimate of the run's training from its parameters (the template's defaults, then the values given),
    printed as a table; a run that cannot train (a batch larger than the data, memory preflight would refuse)
    is refused here, before anything is sent. Where the corpus's size is not known here, the reason instead."""
    from components.lib.estimates import EstimateArguments, check_memory_fit, estimate_run, estimate_table

    spec = job.to_dict()["pipelineSpec"]
    defaults = {
        name: parameter.get("defaultValue")
        for name, parameter in spec["root"]["inputDefinitions"]["parameters"].items()
    }
    values = {**defaults, **job.to_dict()["runtimeConfig"].get("parameterValues", {})}
    tpu = template_tpu_type(spec)
    try:
        settings = routed_values(values, EstimateArguments, skip_steps=("downstream",))
        if values["validation_corpus"]:  # the shards hold nothing of the corpus out
            settings["holdout_fraction"] = 0.0
        estimated = EstimateArguments(**settings, corpus_bytes=arguments.corpus_bytes, tpu_type=tpu)
        result = estimate_run(estimated, probe=step_values(values, "downstream"))
    except InvalidParameter as error:
        if error.parameter != "corpus_bytes":
            raise
        print(f"warning: no estimate of the training: {error} (a dataset card's dataset_info has it)", file=sys.stderr)
        return f"no estimate: {error}"
    except Exception as error:  # the corpus's bucket, unreachable from here: the estimate is advice
        print(f"warning: no estimate of the training: {type(error).__name__}: {error}", file=sys.stderr)
        return f"no estimate: {error}"
    check_memory_fit(result["memory"], int(values["per_replica_batch_size"]))
    print(f"Estimate of the training on a {tpu} (before the data exists):\n{estimate_table(result)}", file=sys.stderr)
    return result


def submit(arguments: SubmitArguments, credentials: Any = None) -> dict[str, Any]:
    if arguments.dry_run:
        from google.auth.credentials import AnonymousCredentials

        job = build_job(arguments, credentials or AnonymousCredentials())
        request = job.to_dict()
        tasks = sorted(request["pipelineSpec"]["root"]["dag"]["tasks"])
        request["pipelineSpec"] = f"{arguments.template} ({len(tasks)} tasks: {', '.join(tasks)})"
        request["serviceAccount"] = arguments.service_account
        summary = {"dry_run": True, "would_submit": request, "estimate": check_estimate(arguments, job)}
    else:
        job = build_job(arguments, credentials)
        check_estimate(arguments, job)
        job.submit(service_account=arguments.service_account or None)
        summary = {"job": job.resource_name, "console": job._dashboard_uri()}
    if arguments.first_run:
        summary["first_run"] = (
            f"{FIRST_RUN['max_steps']} steps on a sample; when it succeeds it proves {FIRST_RUN_PROVES}"
        )
    return summary


def summary_for_people(summary: dict[str, Any]) -> str:
    first_run = f"\nfirst run: {summary['first_run']}" if "first_run" in summary else ""
    if summary.get("dry_run"):
        request = summary["would_submit"]
        return (
            f"dry run: would submit {request['displayName']} with "
            f"{len(request['runtimeConfig'].get('parameterValues', {}))} "
            f"parameter values, root {request['runtimeConfig']['gcsOutputDirectory']} (--json prints the request)"
            + first_run
        )
    return f"submitted {summary['job']}\nconsole: {summary['console']}{first_run}"


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(SubmitArguments, submit, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
