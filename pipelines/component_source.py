"""``make components``: writes ``pipelines/kfp_components.py``, every step's component function, from the steps'
arguments dataclasses (``pipelines.steps.STEPS``), and ``pipelines/routes.py``, where each pipeline parameter
goes (``pipelines.pipeline.feeds``).

KFP embeds a lightweight component's source text in the compiled YAML and runs that text in the container, so
the parameters have to be in the function's source: ``component_source`` writes it, and the functions live in a
file a reader and a debugger can open. (A generic function with an ``inspect.Signature`` attached compiles, but
its embedded copy has no parameters at run time.)
"""

import sys
from dataclasses import MISSING, fields
from pathlib import Path

from pipelines.pipeline import feeds, pipeline_parameters
from pipelines.steps import STEPS, Step

ARTIFACT_TYPES = ("Input", "Output", "Artifact", "Dataset", "Model", "Metrics", "Markdown", "HTML")


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
        "    from components.lib.job_runner import job_exit_status",
        f"    from pipelines.runners import {step.runner.__name__}",
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


COMPONENTS_FILE = Path(__file__).with_name("kfp_components.py")
ROUTES_FILE = Path(__file__).with_name("routes.py")


def components_source() -> str:
    """The text of ``pipelines/kfp_components.py``: every step's component function (``component_source``)."""
    header = [
        '"""The pipeline\'s component functions, one a step, written by ``make components`` from the steps\'',
        "arguments dataclasses (``pipelines.component_source``); ``tests/test_parameters.py`` fails when this",
        'file differs from what the dataclasses give. Do not edit by hand."""',
        "",
        "from typing import NamedTuple",
        "",
        f"from kfp.dsl import {', '.join(sorted(ARTIFACT_TYPES))}",
    ]
    return "\n\n\n".join(["\n".join(header), *(component_source(step) for step in STEPS.values())])


def routes_source() -> str:
    """The text of ``pipelines/routes.py``: each pipeline parameter and the step parameters it feeds."""
    lines = [
        '"""Where each pipeline parameter goes: step -> that step\'s parameter, written by ``make components`` from',
        "``pipelines.pipeline.feeds`` (a step whose settings dataclass has the field, and ``ALSO_FEEDS``);",
        '``tests/test_parameters.py`` fails when this file differs. Do not edit by hand."""',
        "",
        "ROUTES = {",
        *(f"    {parameter.name!r}: {feeds(parameter)!r}," for parameter in pipeline_parameters()),
        "}",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    """Writes ``pipelines/kfp_components.py`` and ``pipelines/routes.py`` (``make components``)."""
    COMPONENTS_FILE.write_text(components_source())
    ROUTES_FILE.write_text(routes_source())
    return 0


if __name__ == "__main__":
    sys.exit(main())
