"""Each setting is declared once, in a dataclass; the components, the pipeline and run-local follow it. What
is still declared in more than one place (a setting two steps both take) must agree, or say why not."""

import ast
import inspect
from dataclasses import MISSING, fields

import pytest

from components.lib.errors import InvalidParameter
from components.lib.estimates import EstimateArguments
from components.lib.training_plan import TrainingSettings
from components.merge_shards import MergeArguments
from pipelines.component_source import component_source
from pipelines.pipeline import (
    PARAMETER_SOURCES,
    PipelineSettings,
    build_pipeline,
    check_values,
    pipeline_parameters,
)
from pipelines.routes import ROUTES
from pipelines.run_local import LOCAL_DEFAULTS, RunLocalArguments
from pipelines.steps import STEPS, make_component, type_name

ARGUMENTS = [
    *(step.arguments for step in STEPS.values()),
    MergeArguments,
    EstimateArguments,
    PipelineSettings,
]
# Fields of one name that differ on purpose (type must still agree): why.
DIFFERENT_ON_PURPOSE = {
    "output": "each step's own output",
    "batch_size": "texts per tokenizer call (shards) vs samples per evaluation batch",
    "seed": "the training's seed vs the evaluation's fixed masking seed (the same positions in every run)",
    "bf16": "the estimate prices a TPU run, which the vertex target trains in bf16",
    "corpus": "the estimate works from shards unless a corpus is named",
    "holdout_fraction": "a step holds out nothing unless asked; the pipeline holds out 5% without a validation corpus",
    "tokenizer": "the estimate needs no tokenizer",
    "train_shards": "the training needs them; the estimate and the evaluation's baseline do without",
    "evaluation": "a push may go without evaluation results; a report may not",
    "tpu_type": "preflight also checks runs on no TPU; the estimate is of a TPU",
    # the downstream probe fine-tunes: its optimizer and lengths are a fine-tuning's, not pre-training's
    "learning_rate": "pre-training's (the recipe's) vs the downstream probe's fine-tuning (2e-5)",
    "warmup_fraction": "pre-training's (the recipe's) vs the downstream probe's fine-tuning (6%)",
    "weight_decay": "pre-training's (the recipe's) vs the downstream probe's fine-tuning (0.1)",
    "max_length": "the samples' tokens vs the probe's (0: the length the model trained at)",
}


def declarations() -> dict[str, list[tuple[type, object, object]]]:
    """Each field name -> (declaring class, type, default) of every declaration (inherited fields counted once,
    where they are declared)."""
    found: dict[str, list] = {}
    classes = {owner for arguments in ARGUMENTS for owner in arguments.__mro__ if "__dataclass_fields__" in vars(owner)}
    for cls in sorted(classes, key=lambda cls: cls.__name__):
        own = vars(cls).get("__annotations__", {})
        for declared in fields(cls):
            if declared.name in own:
                found.setdefault(declared.name, []).append((cls, type_name(declared), declared.default))
    return found


def drift(found: dict[str, list]) -> list[str]:
    problems = []
    for name, places in sorted(found.items()):
        types = {type_ for _, type_, _ in places}
        defaults = {repr(default) for _, _, default in places}
        where = ", ".join(f"{cls.__name__}={default!r}" for cls, _, default in places)
        if len(types) > 1:
            problems.append(f"{name}: types {sorted(types)} ({where})")
        elif len(defaults) > 1 and name not in DIFFERENT_ON_PURPOSE:
            problems.append(f"{name}: defaults differ ({where})")
    return problems


def test_a_setting_declared_by_several_steps_has_one_type_and_one_default():
    assert drift(declarations()) == []


def test_the_drift_check_catches_a_default_changed_in_one_place():
    found = declarations()
    (estimate_place,) = [place for place in found["model_config"] if place[0].__name__ == "EstimateArguments"]
    found["model_config"] = [
        place if place is not estimate_place else (place[0], place[1], "tiny") for place in found["model_config"]
    ]
    assert drift(found) == ["model_config: defaults differ (EstimateArguments='tiny', TrainingInputs='roberta-base')"]


def test_the_recipe_s_knobs_and_the_batch_pair_are_declared_once():
    assert {cls.__name__ for cls, _, _ in declarations()["mlm_probability"]} == {"ShapeKnobs"}
    for batch in ("per_replica_batch_size", "gradient_accumulation_steps"):
        assert {cls.__name__ for cls, _, _ in declarations()[batch]} == {"BatchSettings"}
    # the downstream probe's fine-tuning has rates of its own (learning_rates, chosen among)
    assert {cls.__name__ for cls, _, _ in declarations()["learning_rate"]} == {"Recipe"}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_component_takes_its_dataclass_fields_with_their_defaults(name):
    step = STEPS[name]
    inputs = make_component(step, "image").component_spec.inputs
    for parameter, _, default in step.parameters():
        assert parameter in inputs, parameter
        if default is not MISSING:
            assert inputs[parameter].default == default, parameter
    for argument in fields(step.arguments):
        if argument.name not in {*step.artifacts, "output", *step.set_by_runner}:
            assert argument.name in inputs, f"{name}: field {argument.name} is no component parameter"
    # the parameters are in the source KFP embeds and runs in the container, not only in the compiled interface
    (function,) = ast.parse(component_source(step)).body
    outputs = {name for name, annotation in step.artifacts.items() if annotation.startswith("Output[")}
    assert {argument.arg for argument in function.args.args} == set(inputs) | outputs


def test_every_pipeline_parameter_feeds_a_step_parameter_of_its_type():
    pipeline_inputs = build_pipeline("local").component_spec.inputs
    components = {name: make_component(step, "image").component_spec.inputs for name, step in STEPS.items()}
    for parameter in pipeline_parameters():
        assert parameter.name in pipeline_inputs
        fed = ROUTES[parameter.name]
        assert fed, f"{parameter.name} feeds no step"
        for step, step_parameter in fed.items():
            assert step_parameter in components[step], f"{parameter.name} -> {step}.{step_parameter}"
            assert components[step][step_parameter].type == pipeline_inputs[parameter.name].type


def test_every_pipeline_parameter_s_default_is_of_its_type():
    """KFP refuses an int where a float is declared (-1 for -1.0) when the pipeline runs, not when it compiles."""
    for parameter in pipeline_parameters():
        assert type(parameter.default) is parameter.type, (parameter.name, parameter.default)
    for step in STEPS.values():
        for name, declared, default in step.parameters():
            assert default is MISSING or type(default).__name__ == declared, (step.name, name, default)


def test_the_pipeline_interface_is_the_documented_one():
    """Changing it changes every submitted run's parameters: this list moves with docs/steps.md's table."""
    assert [name for name, _, _ in PARAMETER_SOURCES] == [
        *("corpus", "validation_corpus", "holdout_fraction", "text_column", "limit", "max_non_utf8_fraction"),
        *("vocab_size", "lowercase"),
        *("tokenizer_sample_bytes", "max_length", "records_per_shard", "num_parts", "init_from", "model_config"),
        *("per_replica_batch_size", "gradient_accumulation_steps", "num_epochs", "max_steps", "recipe"),
        *("mlm_probability", "final_mlm_probability", "batch_warmup_fraction", "learning_rate", "adam_beta2"),
        *("adam_epsilon", "clip_norm"),
        *("warmup_fraction", "warmup_steps", "lr_schedule", "decay_fraction", "weight_decay", "dropout"),
        *("bf16", "steps_per_execution", "xla", "shuffle_buffer", "seed"),
        *("checkpoint_every_steps", "log_every_steps", "eval_batches", "on_divergence", "max_rewinds"),
        *("rehearse_restart",),
        *("accelerator", "replicas"),
        *("tpu_price_per_hour", "checkpoint_dir", "tpu_job_timeout_hours"),
        *("tpu_max_queued_hours", "tpu_provisioning", "vertex_tensorboard"),
        *("allow_tight_memory", "eval_batch_size", "eval_max_batches"),
        *("downstream_tasks", "downstream_text_columns", "downstream_label_column", "downstream_epochs"),
        *("downstream_min_steps",),
        *("downstream_max_steps", "downstream_max_train_samples", "downstream_max_eval_samples"),
        *("downstream_batch_size", "downstream_learning_rates", "downstream_random_init_learning_rates"),
        *("downstream_dev_fraction", "downstream_seeds"),
        *("hub_repo_id",),
        *("hub_private", "hub_license"),
        *("hf_token_secret", "output_root"),
    ]


def test_run_local_takes_every_pipeline_parameter_with_small_run_defaults():
    defaults = {parameter.name: parameter.default for parameter in pipeline_parameters()}
    local = {argument.name: argument.default for argument in fields(RunLocalArguments)}
    assert set(defaults) <= set(local)
    assert set(LOCAL_DEFAULTS) <= set(defaults)
    for name, default in defaults.items():
        assert local[name] == LOCAL_DEFAULTS.get(name, default), name
    arguments = RunLocalArguments(max_steps=7, text_column="body")
    assert arguments.pipeline_values()["max_steps"] == 7
    assert arguments.pipeline_values()["text_column"] == "body"
    assert "pipeline_root" not in arguments.pipeline_values()


def test_the_pipeline_signature_carries_each_parameter_help():
    pipeline = build_pipeline("local")
    inputs = pipeline.component_spec.inputs
    help_text = TrainingSettings.__dataclass_fields__["per_replica_batch_size"].metadata["help"]
    assert inputs["per_replica_batch_size"].description == help_text
    assert inspect.signature(pipeline.pipeline_func).parameters["vocab_size"].default == 25_000


def test_the_component_functions_a_reader_opens_are_the_ones_the_dataclasses_give():
    from pipelines.component_source import COMPONENTS_FILE, ROUTES_FILE, components_source, routes_source

    assert COMPONENTS_FILE.read_text() == components_source(), (
        "pipelines/kfp_components.py is out of date: make components"
    )
    assert ROUTES_FILE.read_text() == routes_source(), "pipelines/routes.py is out of date: make components"
    component = make_component(STEPS["train"], "image")
    assert inspect.getsourcefile(component.python_func) == str(COMPONENTS_FILE)  # a stack trace names the file


def test_the_documented_table_of_parameters_is_the_code_s():
    from conftest import PROJECT_ROOT

    from pipelines.docs import BEGIN, DOC, with_table

    doc = (PROJECT_ROOT / DOC).read_text()
    assert BEGIN in doc, f"{DOC} has lost the parameter table's markers"
    assert doc == with_table(doc), f"{DOC}'s parameter table is out of date: run make docs"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"eval_batch_size": 0}, "--eval-batch-size=0: must be a positive whole number"),
        ({"tpu_price_per_hour": -1.0}, "--tpu-price-per-hour=-1.0: must be 0 (unknown) or positive"),
        ({"limit": -2}, "--limit=-2: must be a positive number of texts, or 0 for all"),
        ({"holdout_fraction": 0.0}, "--holdout-fraction=0.0: must be above 0 when no validation corpus is given"),
        ({"xla": "maybe"}, "--xla='maybe': must be one of ('auto', 'on', 'off')"),
        ({"max_length": 4}, "--max-length=4: must be from 8 to 8192 tokens"),
        ({"hub_repo_id": "no-namespace"}, "--hub-repo-id='no-namespace': must be a Hub repository id"),
        ({"hub_repo_id": "me/m", "hub_license": "Apache 2"}, "--hub-license='Apache 2': must be a Hub license id"),
        ({"tokenizer_samples": 3}, "--tokenizer-samples=3: is not a parameter of the pipeline"),
    ],
)
def test_every_step_checks_the_pipeline_values_before_any_step_runs(values, message):
    with pytest.raises(InvalidParameter) as raised:
        check_values(values)
    assert str(raised.value).startswith(message)


def test_run_local_checks_every_step_before_running_one(tmp_path):
    with pytest.raises(InvalidParameter, match="--eval-batch-size=0"):
        RunLocalArguments(pipeline_root=str(tmp_path / "runs"), eval_batch_size=0)
    assert not (tmp_path / "runs").exists()


def test_the_defaults_and_a_validation_corpus_pass_the_checks():
    check_values({})
    check_values({"validation_corpus": "gs://bucket/valid.txt", "holdout_fraction": 0.0})
    check_values({"hub_repo_id": "me/my-roberta", "hub_private": False})
