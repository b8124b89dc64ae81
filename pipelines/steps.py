"""The pipeline's KFP components, made from the steps' arguments dataclasses.

Each step is a lightweight Python component whose parameters are the fields of its step's dataclass (name,
type, default), so a setting is declared once, in its dataclass, and the components, the pipeline's
parameters (``pipelines.pipeline``) and ``run-local``'s flags follow it. The fields that hold artifacts'
URIs (``tokenizer``, ``train_shards``, ``model`` ...) are the component's artifacts instead, and ``output`` is
the URI of the step's output artifact. In the container the component calls its runner here, which builds
the dataclass (so the step's own checks run), calls the step and records what KFP shows (artifact
metadata, metrics). With ``output_root`` set, a step stores its data output there instead of under the
pipeline root and hands on that URI.

KFP embeds a lightweight component's source text in the compiled YAML and runs that text in the container, so
the parameters have to be in the function's source: ``component_source`` writes it, and ``make components``
keeps the functions in ``pipelines/components.py``, a file a reader and a debugger can open. (A generic function
with an ``inspect.Signature`` attached compiles, but its embedded copy has no parameters at run time.)
"""

import sys
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from components.evaluate import EvaluateArguments, evaluate
from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.results import REPORT_FILE
from components.lib.tpu_catalogue import ON_DEMAND, TPU_TYPES
from components.preflight import PreflightArguments, preflight
from components.push import PushArguments, push
from components.report import ReportArguments, write_report
from components.shards import ShardArguments, corpus_for_split, write_shards
from components.tokenizer import TokenizerArguments, train_tokenizer
from components.train import TrainArguments, train

PARAMETER_TYPES = {"str": str, "int": int, "float": float, "bool": bool}  # what a KFP parameter can be


def type_name(argument: Field) -> str:
    """A dataclass field's type by name (its annotation is a string where the module defers annotations)."""
    return argument.type if isinstance(argument.type, str) else argument.type.__name__


def split_source(settings: dict[str, Any], validation_corpus: str) -> dict[str, Any]:
    """The shards settings of a pipeline split: its corpus and hold-out (``corpus_for_split``)."""
    corpus, holdout_fraction, holdout = corpus_for_split(
        settings["split"], settings["corpus"], validation_corpus, settings["holdout_fraction"]
    )
    return {**settings, "corpus": corpus, "holdout_fraction": holdout_fraction, "holdout": holdout}


ARTIFACT_TYPES = ("Input", "Output", "Artifact", "Dataset", "Model", "Metrics", "Markdown", "HTML")


def run_tokenizer(tokenizer: Any, output_root: str, **settings: Any) -> None:
    tokenizer.uri = storage.relocate(tokenizer.uri, output_root)
    summary = train_tokenizer(TokenizerArguments(output=tokenizer.uri, **settings))
    tokenizer.metadata.update({key: summary[key] for key in ("vocab_size", "fingerprint", "texts_read", "bytes_read")})


def run_shards(tokenizer: Any, shards: Any, output_root: str, validation_corpus: str, **settings: Any) -> None:
    shards.uri = storage.relocate(shards.uri, output_root)
    settings = split_source(settings, validation_corpus)
    manifest = write_shards(ShardArguments(output=shards.uri, tokenizer=tokenizer.uri, **settings))
    shards.metadata.update({key: manifest[key] for key in ("split", "num_records", "bytes_read")})


def run_preflight(
    tokenizer: Any, train_shards: Any, eval_shards: Any, report: Any, output_root: str, **settings: Any
) -> str:
    """Returns the TPU job's timeout as the custom job takes it ("7200s"); "" without a TPU type."""
    report.uri = storage.relocate(report.uri, output_root)
    checked = preflight(
        PreflightArguments(
            tokenizer=tokenizer.uri,
            train_shards=train_shards.uri,
            eval_shards=eval_shards.uri,
            output=report.uri,
            **settings,
        )
    )
    return f"{checked['tpu_job_timeout_seconds']}s" if "tpu_job_timeout_seconds" in checked else ""


def run_train(
    tokenizer: Any,
    train_shards: Any,
    eval_shards: Any,
    model: Any,
    output_root: str,
    pipeline_root: str,
    run_id: str,
    tpu_type: str,
    tpu_provisioning: str,
    **settings: Any,
) -> None:
    model.uri = storage.relocate(model.uri, output_root)
    if not settings["price_per_hour"] and tpu_type:  # the TPU's list price for its provisioning
        tpu = TPU_TYPES[tpu_type]
        settings["price_per_hour"] = tpu.list_price(tpu_provisioning)
        settings["price_source"] = f"{tpu.list_price_source(tpu_provisioning)}, set tpu_price_per_hour"
    if not settings["checkpoint_dir"] and run_id:
        for name, value in (("pipeline_root", pipeline_root), ("run_id", run_id)):
            if "{{" in value:  # a placeholder the backend did not fill: the run's checkpoints would go astray
                raise InvalidParameter(name, value, "was not resolved by the pipeline's backend; set checkpoint_dir")
        # one folder for the pipeline run, whichever attempt of the task or restart of its job trains: a retried
        # task resumes (its model artifact may be a new folder)
        settings["checkpoint_dir"] = storage.join(output_root or pipeline_root, "checkpoints", run_id)
    summary = train(
        TrainArguments(
            tokenizer=tokenizer.uri,
            train_shards=train_shards.uri,
            eval_shards=eval_shards.uri,
            output=model.uri,
            **settings,
        )
    )
    keys = ("total_steps", "samples", "tokens", "first_loss", "last_loss", "accelerator")
    model.metadata.update({key: summary[key] for key in keys})


def run_evaluate(
    model: Any,
    shards: Any,
    train_shards: Any,
    evaluation: Any,
    metrics: Any,
    report: Any,
    output_root: str,
    **settings: Any,
) -> None:
    evaluation.uri = storage.relocate(evaluation.uri, output_root)
    results = evaluate(
        EvaluateArguments(
            model=model.uri, shards=shards.uri, train_shards=train_shards.uri, output=evaluation.uri, **settings
        )
    )
    for name in ("loss", "perplexity", "unigram_perplexity", "masked_accuracy", "masked_tokens"):
        if results[name] is not None:
            metrics.log_metric(name, results[name])
    Path(report.path).write_text(storage.read_text(storage.join(evaluation.uri, REPORT_FILE)))


def run_push(model: Any, evaluation: Any, **settings: Any) -> str:
    return push(PushArguments(model=model.uri, evaluation=evaluation.uri, **settings))["commit_url"]


def run_report(model: Any, evaluation: Any, report: Any, **settings: Any) -> None:
    write_report(ReportArguments(model=model.uri, evaluation=evaluation.uri, output=report.path, **settings))


@dataclass(frozen=True)
class Step:
    """A step as a component: its dataclass's fields are its parameters, except those named after its
    artifacts, ``output`` (its output artifact's URI) and ``set_by_runner``."""

    name: str
    arguments: type
    runner: Callable[..., Any]
    artifacts: dict[str, str]  # parameter -> KFP annotation
    extra: dict[str, tuple[str, Any]] = field(default_factory=dict)  # parameters beyond the fields: (type, default)
    set_by_runner: tuple[str, ...] = ()
    returns: str = ""

    def parameters(self) -> list[tuple[str, str, Any]]:
        """(name, type, default) of each parameter that is not an artifact; the default is ``MISSING`` for a
        field the step requires."""
        parameters = [(name, type_name, default) for name, (type_name, default) in self.extra.items()]
        omitted = {*self.artifacts, "output", *self.set_by_runner}
        for argument in fields(self.arguments):
            if argument.name in omitted:
                continue
            if type_name(argument) not in PARAMETER_TYPES:
                raise TypeError(
                    f"{self.arguments.__name__}.{argument.name}: a component parameter is one of "
                    f"{tuple(PARAMETER_TYPES)}, not {type_name(argument)}"
                )
            parameters.append((argument.name, type_name(argument), argument.default))
        return parameters


OUTPUT_ROOT = {"output_root": ("str", "")}
# what the pipeline passes the train step from KFP's placeholders: the root and the run's id (a retry's too)
RUN_PLACEHOLDERS = {"pipeline_root": ("str", ""), "run_id": ("str", "")}
# what the vertex target passes the train step to price its cost lines when the run gives no price
TPU_PRICING = {"tpu_type": ("str", ""), "tpu_provisioning": ("str", ON_DEMAND)}
STEPS = {
    step.name: step
    for step in (
        Step("tokenizer", TokenizerArguments, run_tokenizer, {"tokenizer": "Output[Artifact]"}, OUTPUT_ROOT),
        Step(
            "shards",
            ShardArguments,
            run_shards,
            {"tokenizer": "Input[Artifact]", "shards": "Output[Dataset]"},
            {**OUTPUT_ROOT, "validation_corpus": ("str", "")},
            set_by_runner=("holdout",),
        ),
        Step(
            "preflight",
            PreflightArguments,
            run_preflight,
            {
                "tokenizer": "Input[Artifact]",
                "train_shards": "Input[Dataset]",
                "eval_shards": "Input[Dataset]",
                "report": "Output[Artifact]",
            },
            OUTPUT_ROOT,
            returns="str",
        ),
        Step(
            "train",
            TrainArguments,
            run_train,
            {
                "tokenizer": "Input[Artifact]",
                "train_shards": "Input[Dataset]",
                "eval_shards": "Input[Dataset]",
                "model": "Output[Model]",
            },
            {**OUTPUT_ROOT, **RUN_PLACEHOLDERS, **TPU_PRICING},
            set_by_runner=("price_source",),
        ),
        Step(
            "evaluate",
            EvaluateArguments,
            run_evaluate,
            {
                "model": "Input[Model]",
                "shards": "Input[Dataset]",
                "train_shards": "Input[Dataset]",
                "evaluation": "Output[Artifact]",
                "metrics": "Output[Metrics]",
                "report": "Output[Markdown]",
            },
            OUTPUT_ROOT,
        ),
        Step(
            "push", PushArguments, run_push, {"model": "Input[Model]", "evaluation": "Input[Artifact]"}, returns="str"
        ),
        Step(
            "report",
            ReportArguments,
            run_report,
            {"model": "Input[Model]", "evaluation": "Input[Artifact]", "report": "Output[HTML]"},
        ),
    )
}


def component_source(step: Step) -> str:
    """The component function's source: the artifacts, then one parameter a field, and a body that hands them
    all to the step's runner."""
    lines = [f"def {step.name}_step("]
    lines += [f"    {name}: {annotation}," for name, annotation in step.artifacts.items()]
    parameters = sorted(step.parameters(), key=lambda parameter: parameter[2] is not MISSING)  # required first
    lines += [
        f"    {name}: {type_name}," if default is MISSING else f"    {name}: {type_name} = {default!r},"
        for name, type_name, default in parameters
    ]
    lines += [f"){' -> ' + step.returns if step.returns else ''}:", *docstring(step)]
    lines += [
        "    values = dict(locals())",
        "    from components.lib.jobs import job_exit_status",
        f"    from pipelines.steps import {step.runner.__name__}",
        "",
        "    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command",
        f"        return {step.runner.__name__}(**values)",
    ]
    return "\n".join(lines) + "\n"


def docstring(step: Step) -> list[str]:
    """The function's docstring: a line on the step, and its fields' help as the "Args:" that KFP turns into
    the component's input descriptions."""
    helps = {argument.name: argument.metadata.get("help", "") for argument in fields(step.arguments)}
    names = [*step.artifacts, *(name for name, _, _ in step.parameters())]
    described = [f"        {name}: {helps[name]}" for name in names if helps.get(name)]
    assert not any('"""' in line or "\\" in line for line in described), "help text that breaks the docstring"
    return [f'    """The {step.name} step: components.{step.name}.', "", "    Args:", *described, '    """']


COMPONENTS_FILE = Path(__file__).with_name("components.py")


def components_source() -> str:
    """The text of ``pipelines/components.py``: every step's component function (``component_source``)."""
    header = [
        '"""The pipeline\'s component functions, one a step, written by ``make components`` from the steps\'',
        "arguments dataclasses (``pipelines.steps.component_source``); ``tests/test_parameters.py`` fails when this",
        'file differs from what the dataclasses give. Do not edit by hand."""',
        "",
        f"from kfp.dsl import {', '.join(sorted(ARTIFACT_TYPES))}",
    ]
    return "\n\n\n".join(["\n".join(header), *(component_source(step) for step in STEPS.values())])


def make_component(step: Step, image: str) -> Any:
    """The KFP component of ``step``: its function in ``pipelines/components.py``, on ``image``."""
    from pipelines import components

    return dsl.component(getattr(components, f"{step.name}_step"), base_image=image, install_kfp_package=False)


def part_indices(num_parts: int) -> list:
    from components.lib.errors import InvalidParameter
    from components.lib.jobs import job_exit_status

    with job_exit_status([]):
        if num_parts < 1:
            raise InvalidParameter("num_parts", num_parts, "must be a positive whole number")
        return list(range(num_parts))


def merge_shards_step(output_root: str, parts: Input[list[Dataset]], shards: Output[Dataset]):
    from components.lib.jobs import job_exit_status
    from components.lib.shard_set import gather_parts
    from components.lib.storage import relocate

    with job_exit_status([output_root, *parts]):
        shards.uri = relocate(shards.uri, output_root)
        manifest = gather_parts([part.uri for part in parts], shards.uri)
        shards.metadata.update({"split": manifest["split"], "num_records": manifest["num_records"]})


def main() -> int:
    """Writes ``pipelines/components.py`` (``make components``)."""
    COMPONENTS_FILE.write_text(components_source())
    return 0


def make_steps(cpu_image: str, train_image: str) -> dict[str, Any]:
    """Every component by step name, bound to its image (the project's package and kfp are in both)."""
    components = {
        name: make_component(step, train_image if name == "train" else cpu_image) for name, step in STEPS.items()
    }
    for function in (part_indices, merge_shards_step):
        components[function.__name__.removesuffix("_step")] = dsl.component(
            function, base_image=cpu_image, install_kfp_package=False
        )
    return components


if __name__ == "__main__":
    sys.exit(main())
