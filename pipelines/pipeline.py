"""The pre-training pipeline: tokenizer -> train and validation shards -> train -> evaluate -> Hub push.

The training and the validation shards fan out over ``num_parts`` tasks each (``dsl.ParallelFor``), whose
outputs a merge step a split gathers. The push runs only when ``hub_repo_id`` is set;
its token comes from ``HF_TOKEN`` locally and from the Secret Manager secret ``hf_token_secret`` on Vertex AI,
so no secret value is ever a pipeline parameter. Every hand-over is an artifact URI under the pipeline root
(``gs://`` on Vertex AI), or under ``output_root`` when it is set. ``build_pipeline`` makes the pipeline for a
target:

* ``local``: every step a plain component, for ``kfp.local``;
* ``vertex``: the train step runs as a Vertex AI custom job on a TPU (see ``TPU_TYPES``), with the defaults a
  TPU run wants: ``accelerator=tpu`` (a TPU that does not start fails the step, never a CPU run), ``bf16``, the
  TPU's replica count checked by preflight and by the train step, and its peak for MFU.
"""

import inspect
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from kfp import compiler, dsl

from components.downstream import DownstreamArguments
from components.evaluate import EvaluateArguments
from components.lib.base_model import BaseModelChoice
from components.lib.corpus import CorpusSpec
from components.lib.downstream_tasks import TaskSelection
from components.lib.errors import InvalidParameter
from components.lib.hub import HubToken
from components.lib.tpu_catalogue import REPLACEMENT_MARGIN_MINUTES, TPU_RUNTIME_ENV, TPU_TYPES, TpuType
from components.lib.training_plan import TrainingSettings
from components.preflight import PreflightArguments
from components.push import PushArguments
from components.shards import ShardArguments
from components.tokenizer import TokenizerArguments
from pipelines.routes import ROUTES
from pipelines.run_folders import PIPELINE_NAME
from pipelines.runners import split_source
from pipelines.steps import PARAMETER_TYPES, STEPS, make_steps, type_name
from pipelines.vertex_jobs import tpu_worker_pool

DEFAULT_CPU_IMAGE = "tpu-mlm-cpu:latest"
TARGETS = ("local", "vertex")
# CPU and memory requests on Vertex AI for the CPU steps (tokenizing uses every core).
CPU_RESOURCES = {
    "tokenizer": ("8", "32G"),
    "shards": ("8", "32G"),
    "evaluate": ("8", "32G"),
    "downstream": ("8", "32G"),
    "push": ("2", "8G"),
    "report": ("2", "8G"),
    "preflight": ("2", "8G"),
}


def peak_cpus(num_parts: int) -> tuple[str, int]:
    """The widest stage of a run's CPU steps on Vertex AI and the vCPUs it holds at once (``CPU_RESOURCES``; the
    stages in the order of the DAG, ``data_tasks`` and ``result_tasks``): the shards step runs for both splits of
    every part side by side, the evaluation beside the probe, the report beside the push. The merges and the TPU
    task's launcher take Vertex AI's default machine, which ``CPU_RESOURCES`` does not size: they are not counted."""
    cpus = {name: int(cpu) for name, (cpu, _) in CPU_RESOURCES.items()}
    stages = {
        "tokenizer": cpus["tokenizer"],
        f"shards: 2 x {num_parts} part(s) at once": 2 * num_parts * cpus["shards"],
        "preflight": cpus["preflight"],
        "evaluation beside the probe": cpus["evaluate"] + cpus["downstream"],
        "report beside the push": cpus["report"] + cpus["push"],
    }
    widest = max(stages, key=lambda stage: stages[stage])
    return widest, stages[widest]


def check_target(target: str, tpu_type: str) -> None:
    if target not in TARGETS:
        raise InvalidParameter("target", target, f"must be one of {TARGETS}")
    if tpu_type not in TPU_TYPES:
        raise InvalidParameter("tpu_type", tpu_type, f"must be one of {list(TPU_TYPES)}")


# Retries of the TPU task on Vertex AI, after a wait for TPU capacity to come back (a reclaimed Spot TPU's): each
# resumes from the run's last checkpoint; a failure that repeats costs a TPU start and the steps since it.
DEFAULT_TRAIN_RETRIES = 2
RETRY_BACKOFF = "600s"

# The TPU job's limit where no preflight sets one (the component reused on its own): a day, not GCPC's 7 days.
STANDALONE_TIMEOUT = "86400s"


def tpu_training_job(train_component: Any, tpu: TpuType, env: dict[str, str], launcher_image: str) -> Any:
    """The train component as a Vertex AI custom job on the TPU ``tpu``, launched from ``launcher_image`` (the CPU
    image) by ``pipelines.launch_custom_job``, whose retries create a new job where GCPC's would re-read the failed
    one.

    * ``restart_job_on_worker_restart``: when Vertex AI restarts the worker (VM maintenance, a crash), the whole
      job restarts, and training resumes from its last checkpoint; it does not retry a job that failed.
    * The worker pool is ``tpu_worker_pool``'s, the smoke test's too: the helper cannot say a v5e's machine, and
      its default boot disk (``pd-ssd``) is not among a TPU VM's (Cloud TPU supports balanced persistent disks).
    * A hard limit: the pipeline passes the one preflight derives from the run's estimate; no replacement job is
      created with less of it left than the TPU's start deadline and a margin.
    * ``env``: the TPU runtime's settings (``TPU_RUNTIME_ENV`` and the compile's changes), not baked in the image.
    * On a slice of several hosts, one container a host, each under the slice launcher (``components.slice``):
      the train step on host 0, a TPU worker server on every host.
    * The job runs as the pipeline run's service account (resolved by Vertex AI at run time), not as Vertex
      AI's custom-code service agent, so it has the run's access to the bucket and Secret Manager."""
    from google_cloud_pipeline_components._placeholders import SERVICE_ACCOUNT_PLACEHOLDER
    from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component

    job = create_custom_training_job_from_component(
        train_component,
        display_name="train",
        restart_job_on_worker_restart=True,
        service_account=SERVICE_ACCOUNT_PLACEHOLDER,
        timeout=STANDALONE_TIMEOUT,  # the pipeline passes preflight's, derived from the run's estimate
    )
    worker_pools = job.component_spec.inputs["worker_pool_specs"].default
    container = worker_pools[0]["container_spec"]  # the train component's, with the helper's placeholders
    command = exec_command(container["command"])
    worker_pools[0] = tpu_worker_pool(tpu, container["image_uri"], command, container["args"], env)
    launcher = job.component_spec.implementation.container
    if launcher.args[:2] != ["--type", "CustomJob"] or "--gcp_resources" not in launcher.args:
        raise RuntimeError(f"GCPC's custom job launcher changed its arguments: {launcher.args[::2]}")
    launcher.image = launcher_image
    launcher.command = ["python", "-m", "pipelines.launch_custom_job"]
    launcher.args += ["--min_minutes_left", str(tpu.start_deadline_minutes + REPLACEMENT_MARGIN_MINUTES)]
    launcher.args += ["--run_name", dsl.PIPELINE_JOB_NAME_PLACEHOLDER]  # labels the job: tpu-mlm status finds it
    # where a job attached to a Vertex AI TensorBoard gets its output folder: the run's own under the pipeline root
    launcher.args += ["--pipeline_root", dsl.PIPELINE_ROOT_PLACEHOLDER]
    return job


EXECUTOR_LINE = "_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main"


def exec_command(command: list[str]) -> list[str]:
    """KFP's ``sh -ec`` command with the Python executor ``exec``'d: the image's ``sh`` (dash) would stay the
    job's main process, which does not pass SIGTERM on (as PID 1 it ignores it), so the train step would never
    hear the notice Vertex AI gives before a preemption or a stop, and could not checkpoint."""
    shell, flags, script, *rest = command
    if shell != "sh" or script.count(EXECUTOR_LINE) != 1:
        raise RuntimeError(f"KFP's component command changed; cannot exec its executor: {command[:3]}")
    return [shell, flags, script.replace(EXECUTOR_LINE, f"exec env {EXECUTOR_LINE}"), *rest]


@dataclass
class PipelineSettings:
    """The pipeline's parameters that are no step's field."""

    validation_corpus: str = field(
        default="", metadata={"help": "Corpus of the validation shards; else a held-out fraction of the corpus."}
    )
    holdout_fraction: float = field(
        default=0.05,
        metadata={"help": "Share of the corpus's texts held out for validation when there is no validation corpus."},
    )
    hub_repo_id: str = field(
        default="",
        metadata={"help": "Push model, tokenizer and model card to this Hub repository at the end; none if empty."},
    )
    output_root: str = field(
        default="", metadata={"help": "Store the steps' data here (gs:// or a folder) instead of the pipeline root."}
    )


@dataclass(frozen=True)
class PipelineParameter:
    """A pipeline parameter: a field of a dataclass (its type, default and help), perhaps under another name."""

    name: str
    source: type
    field_name: str
    type: type
    default: Any
    metadata: Any  # the field's: help, choices

    @property
    def help(self) -> str:
        return self.metadata.get("help", "")


# The training parameters are the training's settings, but for what the pipeline sets itself (the artifacts, the
# TPU's name and peak) and what only the command line offers (pushing every checkpoint to the Hub).
NOT_PIPELINE_PARAMETERS = (
    "tokenizer",
    "train_shards",
    "eval_shards",
    "tpu",
    "peak_tflops",
    "hub_repo_id",
    "hub_private",
)
# (name, dataclass, field) in the order the pipeline shows them; the name is the field's unless given
PARAMETER_SOURCES: tuple[tuple[str, type, str], ...] = (
    ("corpus", CorpusSpec, "corpus"),
    ("validation_corpus", PipelineSettings, "validation_corpus"),
    ("holdout_fraction", PipelineSettings, "holdout_fraction"),
    ("text_column", CorpusSpec, "text_column"),
    ("limit", CorpusSpec, "limit"),
    ("max_non_utf8_fraction", CorpusSpec, "max_non_utf8_fraction"),
    ("vocab_size", TokenizerArguments, "vocab_size"),
    ("lowercase", TokenizerArguments, "lowercase"),
    ("tokenizer_sample_bytes", TokenizerArguments, "sample_bytes"),
    ("max_length", ShardArguments, "max_length"),
    ("records_per_shard", ShardArguments, "records_per_shard"),
    ("num_parts", ShardArguments, "num_parts"),
    ("init_from", BaseModelChoice, "init_from"),  # the tokenizer step's too
    *(
        ("tpu_price_per_hour" if setting.name == "price_per_hour" else setting.name, TrainingSettings, setting.name)
        for setting in fields(TrainingSettings)
        if setting.name not in NOT_PIPELINE_PARAMETERS and setting.name not in BaseModelChoice.__dataclass_fields__
    ),
    ("tpu_job_timeout_hours", PreflightArguments, "tpu_job_timeout_hours"),
    ("tpu_max_queued_hours", PreflightArguments, "tpu_max_queued_hours"),
    ("tpu_provisioning", PreflightArguments, "tpu_provisioning"),
    ("vertex_tensorboard", PreflightArguments, "vertex_tensorboard"),
    ("allow_tight_memory", PreflightArguments, "allow_tight_memory"),
    ("eval_batch_size", EvaluateArguments, "batch_size"),
    ("eval_max_batches", EvaluateArguments, "max_batches"),
    *((f"downstream_{name}", TaskSelection, name) for name in ("tasks", "text_columns", "label_column")),
    *(
        (f"downstream_{name}", DownstreamArguments, name)
        for name in (
            "epochs",
            "min_steps",
            "max_steps",
            "max_train_samples",
            "max_eval_samples",
            "batch_size",
            "learning_rates",
            "random_init_learning_rates",
            "dev_fraction",
            "seeds",
        )
    ),
    ("hub_repo_id", PipelineSettings, "hub_repo_id"),
    ("hub_private", PushArguments, "private"),
    ("hub_license", PushArguments, "license"),
    ("hf_token_secret", HubToken, "hf_token_secret"),
    ("output_root", PipelineSettings, "output_root"),
)
# What a parameter feeds beyond the steps whose dataclass has its field: step -> that step's parameter
ALSO_FEEDS = {
    "holdout_fraction": {"shards": "holdout_fraction"},
    "validation_corpus": {"shards": "validation_corpus"},
    "output_root": {name: "output_root" for name, step in STEPS.items() if "output_root" in step.extra},
    "hub_repo_id": {"preflight": "hub_repo_id", "push": "repo_id"},
    "hf_token_secret": {"preflight": "hf_token_secret", "push": "hf_token_secret"},
}


def target_defaults(target: str, tpu: TpuType) -> dict[str, Any]:
    """The defaults a target changes: a TPU run wants the TPU (a TPU that does not start fails the step, never
    a CPU run), bfloat16 and the TPU's replica count (its batch is the batch settings' 0, read on the TPU)."""
    if target != "vertex":
        return {}
    return {"accelerator": "tpu", "bf16": True, "replicas": tpu.replicas}


def pipeline_parameters(defaults: dict[str, Any] | None = None) -> list[PipelineParameter]:
    """Every pipeline parameter, its default from its field unless ``defaults`` names another."""
    parameters = []
    for name, source, field_name in PARAMETER_SOURCES:
        setting = source.__dataclass_fields__[field_name]
        default = (defaults or {}).get(name, setting.default)
        if default is MISSING:
            raise TypeError(f"{source.__name__}.{field_name}: a pipeline parameter needs a default")
        type_ = PARAMETER_TYPES[type_name(setting)]
        parameters.append(PipelineParameter(name, source, field_name, type_, default, setting.metadata))
    return parameters


def feeds(parameter: PipelineParameter) -> dict[str, str]:
    """The steps a parameter feeds: those whose dataclass has its field, and ``ALSO_FEEDS``."""
    fed = {
        name: parameter.field_name
        for name, step in STEPS.items()
        if issubclass(step.arguments, parameter.source) and parameter.source is not PipelineSettings
    }
    return {**fed, **ALSO_FEEDS.get(parameter.name, {})}


def step_inputs(parameters: list[PipelineParameter], values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For each step, its parameters' values (pipeline channels inside the pipeline), routed by ``ROUTES``."""
    inputs: dict[str, dict[str, Any]] = {name: {} for name in STEPS}
    for parameter in parameters:
        for step, step_parameter in ROUTES[parameter.name].items():
            inputs[step][step_parameter] = values[parameter.name]
    return inputs


def routed_values(values: dict[str, Any], settings: type, skip_steps: tuple[str, ...] = ()) -> dict[str, Any]:
    """The pipeline parameter ``values`` that ``ROUTES`` sends to a field of the dataclass ``settings``, under the
    field's name and as its type (a compiled template's numbers are floats); routes into ``skip_steps`` left out
    (the downstream probe's fine-tuning settings have pre-training's names: ``max_steps``, ``learning_rate``)."""
    types = {setting.name: PARAMETER_TYPES[type_name(setting)] for setting in fields(settings)}
    return {
        field_name: types[field_name](values[name])
        for name, routes in ROUTES.items()
        if name in values
        for step, field_name in routes.items()
        if field_name in types and step not in skip_steps
    }


def step_values(values: dict[str, Any], step: str) -> dict[str, Any]:
    """The pipeline parameter ``values`` that ``ROUTES`` sends to ``step``, under the step's parameter names."""
    return {routes[step]: values[name] for name, routes in ROUTES.items() if name in values and step in routes}


def check_values(values: dict[str, Any]) -> None:
    """Every step's own checks on pipeline parameter values, before any step runs: each step's dataclass is
    built from what the step would get (the defaults for values not given), with placeholders for the
    folders its artifacts would be. An error names the pipeline's parameter."""
    parameters = pipeline_parameters()
    unknown = sorted(set(values) - {parameter.name for parameter in parameters})
    if unknown:
        raise InvalidParameter(unknown[0], values[unknown[0]], "is not a parameter of the pipeline")
    inputs = step_inputs(parameters, {**{parameter.name: parameter.default for parameter in parameters}, **values})
    for name, step in STEPS.items():
        if name == "push" and not inputs["push"]["repo_id"]:
            continue  # no push, nothing to check
        own = {argument.name: argument for argument in fields(step.arguments)}
        given = {key: value for key, value in inputs[name].items() if key in own}
        if name == "shards":  # the stricter of its two splits
            given = split_source({**given, "split": "validation"}, inputs["shards"]["validation_corpus"])
        folders = {*step.artifacts, "output"}  # what the step gets from artifacts, not parameters
        placeholders = {key: f"/placeholder/{key}" for key in own if key in folders or own[key].default is MISSING}
        try:
            step.arguments(**{**placeholders, **given})
        except InvalidParameter as error:
            renamed = {ROUTES[parameter.name].get(name): parameter.name for parameter in parameters}
            raise InvalidParameter(renamed.get(error.parameter, error.parameter), error.value, error.expected) from None
    check_model_config(inputs)


def check_model_config(inputs: dict[str, dict[str, Any]]) -> None:
    """The model config that preflight and the train step load once the shards exist (a preset, a config.json, a
    Hub model) and the dropout it must take, loaded here with the vocabulary and sample length the run asks for
    and the tokenizer step's special-token ids, before the first step runs."""
    from components.lib.modeling import model_config, pretraining_config
    from components.lib.tokenization import SPECIAL_TOKEN_ROLES, SPECIAL_TOKENS

    shards = {
        "vocab_size": int(inputs["tokenizer"]["vocab_size"]),
        "max_length": int(inputs["shards"]["max_length"]),
        # the ids the tokenizer step gives them: their place in its special tokens, which it adds first
        "special_tokens": {role: SPECIAL_TOKENS.index(token) for role, token in SPECIAL_TOKEN_ROLES.items()},
    }
    pretraining_config(model_config(inputs["train"]["model_config"], shards), float(inputs["train"]["dropout"]))


@dataclass(frozen=True)
class Target:
    """What the pipeline's target changes in its DAG: Vertex AI runs the train step as a TPU custom job with
    retries and sizes the CPU steps' machines; kfp.local runs everything on this machine, one part at a time."""

    vertex: bool
    tpu: TpuType
    train_retries: int
    # kfp.local runs loop items in threads that share its stdout, which run-local reads step by step; each shards
    # part uses every core anyway. 0: unbounded
    parts_at_once: int


def pipeline_target(target: str, tpu_type: str, train_retries: int) -> Target:
    check_target(target, tpu_type)
    tpu = TPU_TYPES[tpu_type]
    # the default: no retry on a slice (no Spot there, and a failed start costs every host's chips again)
    retries = train_retries if train_retries != -1 else DEFAULT_TRAIN_RETRIES if tpu.hosts == 1 else 0
    vertex = target == "vertex"
    return Target(vertex=vertex, tpu=tpu, train_retries=retries if vertex else 0, parts_at_once=0 if vertex else 1)


@dataclass
class Tasks:
    """Makes the pipeline's tasks: a step's component called with the pipeline parameters routed to it, the
    constants given here winning, on the machine the target gives it."""

    components: dict[str, Any]
    inputs: dict[str, dict[str, Any]]
    target: Target

    def __call__(self, name: str, **arguments: Any) -> Any:
        task = self.components[name](**{**self.inputs[name], **arguments})
        if self.target.vertex and name in CPU_RESOURCES:
            cpu, memory = CPU_RESOURCES[name]
            task.set_cpu_limit(cpu).set_memory_limit(memory)
        return task


def data_tasks(tasks: Tasks) -> tuple[dict[str, Any], Any]:
    """The tokenizer, then the training and the validation shards in ``num_parts`` parts side by side (each part
    reads its share of the corpus, for the texts it keeps or those it holds out) and their merges; returns the data
    the training takes (by its parameter names) and the preflight task that checks it all before the TPU."""
    tokenizer = tasks("tokenizer").set_display_name("tokenizer")
    num_parts = tasks.inputs["shards"]["num_parts"]
    parts = tasks.components["part_indices"](num_parts=num_parts).set_display_name("plan parts")
    with dsl.ParallelFor(items=parts.output, name="shard-parts", parallelism=tasks.target.parts_at_once) as part:
        split_parts = {
            split: tasks("shards", split=split, part=part, tokenizer=tokenizer.outputs["tokenizer"]).set_display_name(
                f"{split} shards part"
            )
            for split in ("train", "validation")
        }
    merged = {
        split: tasks.components["merge_shards"](
            output_root=tasks.inputs["shards"]["output_root"], parts=dsl.Collected(task.outputs["shards"])
        ).set_display_name(f"merge {split} shards")
        for split, task in split_parts.items()
    }
    data = {
        "tokenizer": tokenizer.outputs["tokenizer"],
        "train_shards": merged["train"].outputs["shards"],
        "eval_shards": merged["validation"].outputs["shards"],
    }
    checked = tasks("preflight", tpu_type=tasks.target.tpu.name if tasks.target.vertex else "", **data)
    checked.set_display_name("preflight").set_caching_options(False)  # the token and storage, anew every run
    return data, checked


def training_task(tasks: Tasks, data: dict[str, Any], checked: Any) -> Any:
    """The train step, after preflight; on Vertex AI the TPU job with its hard limit (preflight's, from its
    estimate: Vertex AI's default is 7 days), its provisioning (on demand or Spot), the TPU's peak for MFU and
    type for the cost lines where the run gives no price, and its retries."""
    target = tasks.target
    tpu_job = {
        "timeout": checked.outputs["timeout"],
        "max_wait_duration": checked.outputs["max_wait_duration"],
        "strategy": tasks.inputs["preflight"]["tpu_provisioning"],
        "tensorboard": tasks.inputs["preflight"]["vertex_tensorboard"],
        "tpu_type": target.tpu.name,
        "tpu_provisioning": tasks.inputs["preflight"]["tpu_provisioning"],
    }
    trained = tasks(
        "train",
        peak_tflops=target.tpu.peak_tflops_per_replica if target.vertex else 0.0,
        pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
        run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        **(tpu_job if target.vertex else {}),
        **data,
    )
    trained.set_display_name("train").after(checked)
    trained.set_caching_options(False)
    if target.train_retries:
        # a job Vertex AI ends for good (a Spot TPU reclaimed, say) runs again, from the run's checkpoints
        trained.set_retry(num_retries=target.train_retries, backoff_duration=RETRY_BACKOFF, backoff_factor=1.0)
    return trained.outputs["model"]


def result_tasks(tasks: Tasks, model: Any, data: dict[str, Any]) -> None:
    """The evaluation on the validation shards and the downstream probe, side by side; the run report, and the push
    when a repository is named, with both results (a failed probe's too: it fails neither)."""
    evaluation = tasks("evaluate", model=model, shards=data["eval_shards"], train_shards=data["train_shards"])
    evaluation.set_display_name("evaluate")
    probe = tasks("downstream", model=model).set_display_name("downstream probe")
    results = {
        "evaluation": evaluation.outputs["evaluation"],
        "downstream_results": probe.outputs["downstream_results"],
    }
    tasks("report", model=model, **results).set_display_name("run report")
    with dsl.If(tasks.inputs["push"]["repo_id"] != "", name="push-requested"):
        pushed = tasks("push", model=model, **results)
        pushed.set_display_name("push to the Hub").set_caching_options(False)


def with_parameters(function: Any, parameters: list[PipelineParameter], description: str) -> Any:
    """``function`` (taking the values positionally) as KFP reads a pipeline function: a signature of the
    parameters with their types and defaults, and their help as the docstring's "Args:"."""
    function.__signature__ = inspect.Signature(
        [
            inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default, annotation=p.type)
            for p in parameters
        ]
    )
    function.__doc__ = f"{description}\n\nArgs:\n" + "\n".join(f"    {p.name}: {p.help}" for p in parameters)
    return function


def build_pipeline(
    target: str = "local",
    cpu_image: str = DEFAULT_CPU_IMAGE,
    tpu_image: str = "",
    tpu_type: str = "v3-8",
    tpu_env: dict[str, str] | None = None,
    train_retries: int = -1,
) -> Any:
    rules = pipeline_target(target, tpu_type, train_retries)
    components = make_steps(cpu_image, tpu_image or cpu_image)
    if rules.vertex:
        env = TPU_RUNTIME_ENV if tpu_env is None else tpu_env
        components["train"] = tpu_training_job(components["train"], rules.tpu, env, cpu_image)
    parameters = pipeline_parameters(target_defaults(target, rules.tpu))

    def pretraining(*values: Any) -> None:
        named = dict(zip([parameter.name for parameter in parameters], values, strict=True))
        tasks = Tasks(components, step_inputs(parameters, named), rules)
        data, checked = data_tasks(tasks)
        model = training_task(tasks, data, checked)
        result_tasks(tasks, model, data)

    description = "Pre-train a RoBERTa-style masked language model from scratch."
    return dsl.pipeline(name=PIPELINE_NAME, description=description)(
        with_parameters(pretraining, parameters, description)
    )


def compile_pipeline(path: str, **kwargs: Any) -> str:
    compiler.Compiler().compile(build_pipeline(**kwargs), package_path=path)
    return path
