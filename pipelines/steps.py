"""The pipeline's KFP components, made from the steps' arguments dataclasses.

Each step is a lightweight Python component whose parameters are the fields of its step's dataclass (name,
type, default), so a setting is declared once, in its dataclass, and the components, the pipeline's
parameters (``pipelines.pipeline``) and ``run-local``'s flags follow it. The fields that hold artifacts'
URIs (``tokenizer``, ``train_shards``, ``model`` ...) are the component's artifacts instead, and ``output`` is
the URI of the step's output artifact. In the container the component calls its step's runner
(``pipelines.runners``); its function is written by ``make components`` (``pipelines.component_source``) into
``pipelines/kfp_components.py``. Two small components of the pipeline's own (the parts' indices, the merge of
the parts' shards) are defined here.
"""

from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from typing import Any

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from components.downstream import DownstreamArguments
from components.evaluate import EvaluateArguments
from components.lib.tpu_catalogue import ON_DEMAND
from components.preflight import PreflightArguments
from components.push import PushArguments
from components.report import ReportArguments
from components.shards import ShardArguments
from components.tokenizer import TokenizerArguments
from components.train import TrainArguments
from pipelines.runners import (
    run_downstream,
    run_evaluate,
    run_preflight,
    run_push,
    run_report,
    run_shards,
    run_tokenizer,
    run_train,
)

PARAMETER_TYPES = {"str": str, "int": int, "float": float, "bool": bool}  # what a KFP parameter can be


def type_name(argument: Field) -> str:
    """A dataclass field's type by name (its annotation is a string where the module defers annotations)."""
    return argument.type if isinstance(argument.type, str) else argument.type.__name__


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
# what the pipeline passes the train step from KFP's placeholders: the root and the run's name (a retry's too)
RUN_PLACEHOLDERS = {"pipeline_root": ("str", ""), "run_name": ("str", "")}
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
            returns="NamedTuple('TpuJob', [('timeout', str), ('max_wait_duration', str)])",
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
            "downstream",
            DownstreamArguments,
            run_downstream,
            {
                "model": "Input[Model]",
                "downstream_results": "Output[Artifact]",
                "metrics": "Output[Metrics]",
                "report": "Output[Markdown]",
            },
            OUTPUT_ROOT,
        ),
        Step(
            "push",
            PushArguments,
            run_push,
            {"model": "Input[Model]", "evaluation": "Input[Artifact]", "downstream_results": "Input[Artifact]"},
            set_by_runner=("downstream",),
            returns="str",
        ),
        Step(
            "report",
            ReportArguments,
            run_report,
            {
                "model": "Input[Model]",
                "evaluation": "Input[Artifact]",
                "downstream_results": "Input[Artifact]",
                "report": "Output[HTML]",
            },
            set_by_runner=("downstream",),
        ),
    )
}


def make_component(step: Step, image: str) -> Any:
    """The KFP component of ``step``: its function in ``pipelines/kfp_components.py``, on ``image``."""
    from pipelines import kfp_components

    return dsl.component(getattr(kfp_components, f"{step.name}_step"), base_image=image, install_kfp_package=False)


def part_indices(num_parts: int) -> list:
    from components.lib.errors import InvalidParameter
    from components.lib.job_runner import job_exit_status

    with job_exit_status([]):
        if num_parts < 1:
            raise InvalidParameter("num_parts", num_parts, "must be a positive whole number")
        return list(range(num_parts))


def merge_shards_step(output_root: str, parts: Input[list[Dataset]], shards: Output[Dataset]):
    from components.lib.job_runner import job_exit_status
    from components.lib.shard_set import gather_parts
    from components.lib.storage import relocate

    with job_exit_status([output_root, *parts]):
        shards.uri = relocate(shards.uri, output_root)
        manifest = gather_parts([part.uri for part in parts], shards.uri)
        shards.metadata.update({"split": manifest["split"], "num_records": manifest["num_records"]})


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
