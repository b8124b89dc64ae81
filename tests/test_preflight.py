import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf
from conftest import PROJECT_ROOT, WIKITEXT_VOCAB_SIZE
from transformers import TFAutoModelForMaskedLM

from components.lib.errors import InvalidParameter
from components.lib.modeling import count_parameters, model_config
from components.lib.recipe import RECIPE_GLOBAL_BATCH
from components.lib.shard_set import read_manifest
from components.lib.tpu_catalogue import DEVICE_MICRO_BATCH, TPU_MICRO_BATCH
from components.lib.training_plan import CHECKPOINT_IDENTITY_FILE, plan_training
from components.preflight import PreflightArguments, preflight
from components.train import TrainArguments


def arguments(shards: dict, output: Path, **overrides) -> PreflightArguments:
    values = {
        "tokenizer": shards["tokenizer"],
        "train_shards": shards["train"],
        "eval_shards": shards["validation"],
        "output": str(output),
        "model_config": "tiny",
        "per_replica_batch_size": 16,
        "gradient_accumulation_steps": 1,
        "max_steps": 10,
    }
    return PreflightArguments(**{**values, **overrides})


def test_preflight_passes_and_reports_the_plan(tmp_path, wikitext_shards):
    report = preflight(arguments(wikitext_shards, tmp_path / "out", replicas=8))
    assert report["global_batch_size"] == 128 and report["total_steps"] == 10  # max_steps
    assert report["train_samples"] == read_manifest(wikitext_shards["train"])["num_records"]
    assert report["vocab_size"] == WIKITEXT_VOCAB_SIZE
    assert json.loads((tmp_path / "out" / "preflight.json").read_text())["global_batch_size"] == 128
    assert not (tmp_path / "out" / ".write-probe").exists()


def test_preflight_uses_the_tpu_replica_count_for_the_batch_arithmetic(tmp_path, wikitext_shards):
    samples = read_manifest(wikitext_shards["train"])["num_records"]
    per_replica = samples // 4
    common = {"per_replica_batch_size": per_replica, "eval_shards": ""}
    preflight(arguments(wikitext_shards, tmp_path / "one", replicas=1, **common))
    with pytest.raises(InvalidParameter, match=rf"--per-replica-batch-size={per_replica}: x 8 replica\(s\)"):
        preflight(arguments(wikitext_shards, tmp_path / "eight", replicas=8, **common))
    assert not (tmp_path / "eight").exists()


def test_preflight_refuses_unwritable_storage_and_checkpoint_folder(tmp_path, wikitext_shards):
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(InvalidParameter, match=r"--output=.*a-file/out': is not writable"):
        preflight(arguments(wikitext_shards, tmp_path / "a-file" / "out"))
    # a fixed checkpoint folder is first written once the TPU has started: preflight probes it before
    with pytest.raises(InvalidParameter, match=r"--checkpoint-dir=.*a-file/checkpoints': is not writable"):
        preflight(arguments(wikitext_shards, tmp_path / "out", checkpoint_dir=str(tmp_path / "a-file" / "checkpoints")))
    assert not (tmp_path / "out" / "preflight.json").exists()


def run_preflight(hub, shards, output, env):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "components.preflight",
            "--tokenizer",
            shards["tokenizer"],
            "--train_shards",
            shards["train"],
            "--eval_shards",
            shards["validation"],
            "--model_config",
            "tiny",
            "--per_replica_batch_size",
            "16",
            "--max_steps",
            "10",
            "--hub_repo_id",
            "user/model",
            "--output",
            str(output),
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
def test_preflight_checks_the_hub_token_can_write(tmp_path, wikitext_shards, hub):
    ok = run_preflight(hub, wikitext_shards, tmp_path / "ok", hub.env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "ok" / "preflight.json").read_text())["hub_user"] == "user"
    assert hub.env["HF_TOKEN"] not in ok.stdout + ok.stderr
    assert hub.repos == {}  # checking creates nothing

    read_only = run_preflight(hub, wikitext_shards, tmp_path / "ro", {**hub.env, "HF_TOKEN": "hf_read_only"})
    assert read_only.returncode == 2
    assert "error: --hub-repo-id='user/model': the Hub token may not write (its role is 'read')" in read_only.stderr

    invalid = run_preflight(hub, wikitext_shards, tmp_path / "bad", {**hub.env, "HF_TOKEN": "hf_revoked"})
    assert invalid.returncode == 2 and "the Hub refused the token" in invalid.stderr
    assert not (tmp_path / "ro" / "preflight.json").exists() and not (tmp_path / "bad" / "preflight.json").exists()


ROBERTA_BASE_25K_PARAMETERS = 105_268_648  # roberta-base with a 25,000-piece vocabulary, as built by transformers


def roberta_config(preset: str, vocab_size: int = 25_000):
    manifest = {"vocab_size": vocab_size, "max_length": 128, "special_tokens": {"pad": 1, "bos": 0, "eos": 2}}
    return model_config(preset, manifest)


def test_parameters_are_counted_without_building_the_model():
    assert count_parameters(roberta_config("roberta-base")) == ROBERTA_BASE_25K_PARAMETERS
    tiny = roberta_config("tiny", vocab_size=3000)
    model = TFAutoModelForMaskedLM.from_config(tiny)
    model(model.dummy_inputs)
    assert count_parameters(tiny) == sum(int(tf.size(v)) for v in model.trainable_variables)


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("learning_rate", 0.0, "--learning-rate=0.0: must be a positive number"),
        ("warmup_fraction", 1.0, "--warmup-fraction=1.0: must be at least 0 and below 1"),
        ("weight_decay", -0.1, "--weight-decay=-0.1: must be 0 or positive"),
        ("mlm_probability", 0.0, "--mlm-probability=0.0: must be between 0 and 1"),
        ("steps_per_execution", 0, "--steps-per-execution=0: must be a positive whole number"),
        ("shuffle_buffer", 0, "--shuffle-buffer=0: must be a positive whole number"),
        ("checkpoint_every_steps", 0, "--checkpoint-every-steps=0: must be a positive whole number"),
        ("log_every_steps", 0, "--log-every-steps=0: must be a positive whole number"),
        ("eval_batches", 0, "--eval-batches=0: must be a positive whole number"),
        ("num_epochs", 0, "--num-epochs=0: must be a positive whole number"),
        ("max_steps", -1, "--max-steps=-1: must be 0"),
        ("per_replica_batch_size", -8, "--per-replica-batch-size=-8: must be 0 (the accelerator's default) or"),
        ("gradient_accumulation_steps", -1, "--gradient-accumulation-steps=-1: must be 0 (the accelerator's default)"),
        ("accelerator", "xpu", "--accelerator='xpu': must be one of"),
        ("xla", "maybe", "--xla='maybe': must be one of"),
        ("replicas", -1, "--replicas=-1: must be 0"),
        ("tpu_type", "v4-8", "--tpu-type='v4-8': must be one of"),
        ("tpu_provisioning", "spot", "--tpu-provisioning='spot': must be one of ['STANDARD', 'SPOT']"),
        # a secret's flag never echoes its value: it may be a token typed into the wrong flag
        ("hf_token_secret", "my-secret", "--hf-token-secret='…(redacted)': must be a Secret Manager name"),
    ],
)
def test_preflight_refuses_every_bad_training_setting_the_train_step_refuses(tmp_path, setting, value, message):
    values = {"tokenizer": "tok", "train_shards": "shards", "output": str(tmp_path / "out"), setting: value}
    with pytest.raises(InvalidParameter, match=re.escape(message)):
        PreflightArguments(**values)
    if setting in {f.name for f in dataclasses.fields(TrainArguments)}:  # and the train step says the same
        with pytest.raises(InvalidParameter, match=re.escape(message)):
            TrainArguments(**values)


def test_a_batch_left_at_0_is_planned_at_the_accelerator_s_default_each_value_on_its_own(tmp_path, wikitext_shards):
    """The train step's plan and preflight's read the batch by one rule (``default_batch``): a TPU's batch where the
    strategy is a TPU's, a device's micro-batch elsewhere; a value given is kept."""

    def planned(replicas: int, on_tpu: bool, **batch: int) -> tuple[int, int]:
        batch = {"per_replica_batch_size": 0, "gradient_accumulation_steps": 0, **batch}
        settings = arguments(wikitext_shards, tmp_path / "out", eval_shards="", **batch)
        shape = plan_training(settings, replicas, on_tpu=on_tpu).shape
        return shape.per_replica_batch_size, shape.accumulation

    assert planned(1, on_tpu=False) == (DEVICE_MICRO_BATCH, 1)
    assert planned(8, on_tpu=True) == (TPU_MICRO_BATCH, RECIPE_GLOBAL_BATCH // (8 * TPU_MICRO_BATCH))
    assert planned(8, on_tpu=True, per_replica_batch_size=32) == (32, RECIPE_GLOBAL_BATCH // (8 * TPU_MICRO_BATCH))
    assert planned(2, on_tpu=False, gradient_accumulation_steps=3) == (DEVICE_MICRO_BATCH, 3)


def test_a_resume_at_another_global_batch_is_refused_and_another_micro_batch_of_the_same_one_is_not(
    tmp_path, wikitext_shards
):
    """The train step's plan checks the global batch it will train at; preflight checks it where it knows the
    accelerator (a TPU type), and leaves it to the train step where it does not (the GPUs or TPU found there)."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    folder = {"eval_shards": "", "checkpoint_dir": str(checkpoints)}
    first = arguments(wikitext_shards, tmp_path / "first", **folder, per_replica_batch_size=16)
    identity = plan_training(first, 1).checkpoint_identity
    assert identity["global_batch_size"] == 16
    (checkpoints / CHECKPOINT_IDENTITY_FILE).write_text(json.dumps(identity))  # as the train step writes it
    halves = {"per_replica_batch_size": 8, "gradient_accumulation_steps": 2}
    plan_training(arguments(wikitext_shards, tmp_path / "halves", **folder, **halves), 1)
    doubled = {"per_replica_batch_size": 16, "gradient_accumulation_steps": 2}
    with pytest.raises(InvalidParameter, match="trained at a global batch of 16, and these settings make 32"):
        plan_training(arguments(wikitext_shards, tmp_path / "doubled", **folder, **doubled), 1)
    preflight(arguments(wikitext_shards, tmp_path / "not-known", **folder, **doubled))  # no TPU type: not known
    on_a_tpu = {"tpu_type": "v3-8", "per_replica_batch_size": 2, "gradient_accumulation_steps": 1}  # 2 x 8 = 16
    preflight(arguments(wikitext_shards, tmp_path / "v3-8", **folder, **on_a_tpu))
    with pytest.raises(InvalidParameter, match="trained at a global batch of 16, and these settings make 32"):
        doubled_on_a_tpu = {**on_a_tpu, "gradient_accumulation_steps": 2}
        preflight(arguments(wikitext_shards, tmp_path / "v3-8-doubled", **folder, **doubled_on_a_tpu))
    del identity["global_batch_size"]  # checkpoints from before it was recorded: not known, not refused
    (checkpoints / CHECKPOINT_IDENTITY_FILE).write_text(json.dumps(identity))
    plan_training(arguments(wikitext_shards, tmp_path / "older", **folder, **doubled), 1)
    assert not (tmp_path / "v3-8-doubled").exists()


def test_a_resume_that_would_move_a_batch_warm_up_s_stages_or_add_one_is_refused(tmp_path, wikitext_shards):
    """The stages follow max_steps and the micro-batches, which are no recipe knobs: a resume with others would train
    the steps left at another batch and read the stream from another place."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    warm = {"per_replica_batch_size": 4, "gradient_accumulation_steps": 4, "batch_warmup_fraction": 0.5}
    warm.update(eval_shards="", checkpoint_dir=str(checkpoints))
    first = arguments(wikitext_shards, tmp_path / "first", **warm, max_steps=60)
    identity = plan_training(first, 1).checkpoint_identity
    (checkpoints / CHECKPOINT_IDENTITY_FILE).write_text(json.dumps(identity))  # as the train step writes it
    preflight(arguments(wikitext_shards, tmp_path / "same", **warm, max_steps=60))
    moved = "stages (first step, micro-batches) [[0, 1], [15, 2], [30, 4]], and these settings make [[0, 1], [20, 2]"
    with pytest.raises(InvalidParameter, match=re.escape(moved)):
        preflight(arguments(wikitext_shards, tmp_path / "longer", **warm, max_steps=80))
    # checkpoints from before the knob trained at their recipe's value of it, none
    del identity["recipe"]["batch_warmup_fraction"], identity["batch_stages"]
    (checkpoints / CHECKPOINT_IDENTITY_FILE).write_text(json.dumps(identity))
    with pytest.raises(InvalidParameter, match=r"resume them with --batch_warmup_fraction 0\.0"):
        preflight(arguments(wikitext_shards, tmp_path / "older", **warm, max_steps=60))
    assert not any((tmp_path / name).exists() for name in ("longer", "older"))


def test_preflight_for_a_tpu_estimates_that_run(tmp_path, wikitext_shards):
    report = preflight(arguments(wikitext_shards, tmp_path / "out", tpu_type="v3-8", price_per_hour=8.0))
    assert report["replicas"] == 8 and report["global_batch_size"] == 128
    estimate = report["estimate"]
    assert estimate["steps"] == report["total_steps"] == 10  # max_steps
    assert estimate["tokens"] == 10 * 128 * 128
    assert estimate["cost"] == pytest.approx(estimate["hours"] * 8.0)
    assert report["tpu_job_timeout_seconds"] == 2 * 3600  # 10 steps: the floor


def test_preflight_refuses_a_batch_the_estimate_calls_tight_unless_allowed(tmp_path, wikitext_shards):
    tight = {"tpu_type": "v3-8", "model_config": "roberta-base", "per_replica_batch_size": 256, "bf16": True}
    tight["eval_shards"] = ""  # the validation shards hold fewer samples than a batch of 2048
    with pytest.raises(InvalidParameter) as error:
        preflight(arguments(wikitext_shards, tmp_path / "out", **tight))
    assert error.value.parameter == "per_replica_batch_size" and error.value.value == 256
    assert re.search(r"may not fit: .* GiB per replica of a v3-8's 16 GiB; use \d+ or less", error.value.expected)
    assert "allow_tight_memory=true" in error.value.expected
    allowed = preflight(arguments(wikitext_shards, tmp_path / "allowed", allow_tight_memory=True, **tight))
    assert allowed["memory"]["verdict"] == "tight"
    accumulated = {**tight, "per_replica_batch_size": 128, "gradient_accumulation_steps": 2}
    report = preflight(arguments(wikitext_shards, tmp_path / "accumulated", **accumulated))
    assert report["global_batch_size"] == 2048 and report["memory"]["verdict"] == "fits"  # the same global batch


def test_the_tpu_job_s_limit_is_derived_from_the_estimate_or_checked_against_it():
    from components.preflight import tpu_job_timeout

    assert tpu_job_timeout(0, 0.05) == 2 * 3600  # a short run gets the floor: its start alone takes minutes
    assert tpu_job_timeout(0, 10.0) == 21 * 3600  # twice the estimate, plus an hour
    assert tpu_job_timeout(0, 500.0) == 168 * 3600  # never over Vertex AI's default
    assert tpu_job_timeout(5, 3.0) == 5 * 3600
    with pytest.raises(InvalidParameter, match=r"--tpu-job-timeout-hours=1: is below the estimated 3.00 h"):
        tpu_job_timeout(1, 3.0)


def test_preflight_for_a_slice_wants_a_shard_file_per_host_at_least_and_no_spot(
    tmp_path, embedded_shards, embedded_shards_in_files
):
    """A v5e-16 is 4 hosts, each reading a share of the training shard files: one file cannot be shared."""
    slice_run = {"tpu_type": "v5e-16", "per_replica_batch_size": 2}
    with pytest.raises(InvalidParameter) as error:
        preflight(arguments(embedded_shards, tmp_path / "one-file", **slice_run))
    samples = read_manifest(embedded_shards["train"])["num_records"]
    assert error.value.parameter == "train_shards" and error.value.expected == (
        "hold 1 shard file(s), fewer than the 4 hosts that each read a share of them; write the shards again with "
        f"--records_per_shard {samples // 4} or fewer (or with more --num_parts)"
    )
    report = preflight(arguments(embedded_shards_in_files, tmp_path / "files", **slice_run))
    assert report["replicas"] == 16 and report["global_batch_size"] == 32
    # validation shards in one file are read by record, each host every 4th: no refusal after the data steps ran
    one_validation_file = {**embedded_shards_in_files, "validation": embedded_shards["validation"]}
    assert preflight(arguments(one_validation_file, tmp_path / "one-validation-file", **slice_run))["replicas"] == 16
    with pytest.raises(InvalidParameter, match=re.escape("--tpu-provisioning='SPOT': Vertex AI has no Spot for TPU")):
        arguments(embedded_shards_in_files, tmp_path / "spot", tpu_provisioning="SPOT", **slice_run)


def labelled_folder(folder: Path, case: str) -> str:
    """A folder of labelled .jsonl files with one flaw, as a downstream task."""
    train = [{"review": f"text {i}", "stars": "pos" if i % 2 else "neg"} for i in range(20)]
    if case == "a missing column":
        train = [{"review": row["review"], "rating": row["stars"]} for row in train]
    if case == "a label column of text":
        train = [{"review": f"text {i}", "stars": f"label {i}"} for i in range(150)]
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in train))
    if case != "no validation split":
        (folder / "validation.jsonl").write_text(json.dumps({"review": "x", "stars": "pos"}) + "\n")
    return str(folder)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("a missing column", "its train split has no column 'stars'"),
        ("a label column of text", "its labels take 150 values in 150 rows: a text column, not classes?"),
        ("no validation split", "holds no validation file"),
    ],
)
def test_preflight_loads_the_downstream_tasks_and_refuses_a_bad_one_in_one_line(
    tmp_path, wikitext_shards, case, message
):
    task = labelled_folder(tmp_path / "task", case)
    probe = {"tasks": f"word-order,{task}", "text_columns": "review", "label_column": "stars"}
    with pytest.raises(InvalidParameter) as refused:
        preflight(arguments(wikitext_shards, tmp_path / "out", **probe))
    assert str(refused.value).startswith(f"--tasks='{task}': {message}") and "\n" not in str(refused.value)
    assert not (tmp_path / "out" / "preflight.json").exists()
    good = labelled_folder(tmp_path / "good", "")
    report = preflight(arguments(wikitext_shards, tmp_path / "out", **{**probe, "tasks": f"word-order,{good}"}))
    word_order, labelled = report["downstream_tasks"]
    assert word_order["task"] == "word-order" and word_order["labels"] == ["reordered", "original"]
    assert labelled == {
        "task": good,
        "labels": ["neg", "pos"],
        "train_samples": 20,
        "validation_samples": 1,
        "validation_split": "validation",
    }


def test_the_check_submit_runs_before_the_data_accepts_the_identity_the_train_step_writes(tmp_path, wikitext_shards):
    """submit --resume runs check_checkpoints_match, preflight's and the train step's own check, on the identity the
    run's parameters settle before its data exists: the same settings pass it, another model or recipe does not."""
    from components.lib.recipe import resolve_recipe
    from components.lib.training_plan import check_checkpoints_match, identity_before_data

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    trained = arguments(wikitext_shards, tmp_path / "first", checkpoint_dir=str(checkpoints), learning_rate=1e-3)
    identity = plan_training(trained, 1).checkpoint_identity
    (checkpoints / CHECKPOINT_IDENTITY_FILE).write_text(json.dumps(identity))  # as the train step writes it
    max_length = read_manifest(wikitext_shards["train"])["max_length"]
    recipe = resolve_recipe({"learning_rate": 1e-3})
    # the vocabulary asked of the tokenizer, which a small corpus may leave short of it: the data's to settle
    check_checkpoints_match(
        str(checkpoints), identity_before_data("tiny", WIKITEXT_VOCAB_SIZE + 1000, max_length, recipe)
    )
    with pytest.raises(InvalidParameter, match=r"another model \(.*hidden_size.*differ\)"):
        check_checkpoints_match(str(checkpoints), identity_before_data("mini", WIKITEXT_VOCAB_SIZE, max_length, recipe))
    with pytest.raises(InvalidParameter, match=r"other recipe knobs; resume them with --learning_rate 0\.001"):
        default_recipe = resolve_recipe({})
        check_checkpoints_match(
            str(checkpoints), identity_before_data("tiny", WIKITEXT_VOCAB_SIZE, max_length, default_recipe)
        )
