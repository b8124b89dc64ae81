"""A training whose loss stops being finite: it stops within one call into the graph with one line and exit status 4
(which the TPU task's launcher does not retry), writes no checkpoint or model from those weights, or, asked to,
rewinds to its last checkpoint, skips the batches after it and goes on. Each run is the train step's own command on
a tiny model (the first through KFP's executor and the TPU task's launcher); a blow-up is either real (an absurd
peak learning rate) or the weights set to NaN at a chosen call (``tests/kill_at.py --action nan``), as a step that
overflowed would leave them."""

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_at, run_module
from test_launch_custom_job import compiled_train_job, launcher
from vertex_server import VertexStandIn

from components.lib.job_runner import DIVERGED_EXIT
from components.lib.results import SUMMARY_FILE

pytestmark = pytest.mark.slow  # each trains in a process of its own

SAVE = "components.lib.training_state:TrainingState.save"


def train_job(shards: dict, output, *extra: str) -> list[str]:
    data = ["--tokenizer", shards["tokenizer"], "--train_shards", shards["train"]]
    tiny = ["--model_config", "tiny", "--per_replica_batch_size", "8", "--accelerator", "cpu", "--max_steps", "30"]
    pace = ["--steps_per_execution", "5", "--log_every_steps", "5", "--checkpoint_every_steps", "10"]
    return ["components.train", *data, *tiny, *pace, "--output", str(output), *extra]


def checkpoint_steps_all_finite(checkpoints) -> list[int]:
    """The steps of the checkpoints kept in ``checkpoints``, after checking that every float they hold is finite."""
    state = tf.train.get_checkpoint_state(str(checkpoints))
    paths = list(state.all_model_checkpoint_paths) if state else []
    for path in paths:
        reader = tf.train.load_checkpoint(path)
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if dtype.is_floating:
                assert np.isfinite(reader.get_tensor(name)).all(), f"{path}: {name} is not finite"
    return [int(path.rsplit("-", 1)[1]) for path in paths]


def test_an_absurd_peak_rate_stops_the_run_at_once_and_its_tpu_job_is_not_replaced(tmp_path, embedded_shards):
    """The compiled train step as its TPU job runs it, created by the pipeline's launcher through the Vertex AI
    stand-in (which restarts a worker that exits non-zero, as Vertex AI does): the loss is NaN from the first log
    window; the step writes its verdict and the job ends cleanly after one start; the task exits 4 with the step's
    line, and its retry creates no second job (the same data and seed would diverge again)."""
    tiny = {"model_config": "tiny", "per_replica_batch_size": 8, "accelerator": "cpu", "replicas": 0, "max_steps": 30}
    pace = {"steps_per_execution": 5, "log_every_steps": 5, "checkpoint_every_steps": 10}
    absurd = {"learning_rate": 1e30, "warmup_steps": 0, "warmup_fraction": 0.0}
    command = compiled_train_job(tmp_path, embedded_shards, {**tiny, **pace, **absurd})
    pool = {"machine_spec": {"machine_type": "cloud-tpu"}, "replica_count": 1, "container_spec": {"command": command}}
    payload = {"display_name": "train", "job_spec": {"worker_pool_specs": [pool]}}
    record = tmp_path / "gcp_resources"
    with VertexStandIn() as vertex:
        first = run_module("pipelines.launch_custom_job", *launcher(vertex, payload, record))
        (name,) = vertex.jobs
        job_log = vertex.logs[name]
        retried = run_module("pipelines.launch_custom_job", *launcher(vertex, payload, record))
        assert list(vertex.jobs) == [name]  # no second TPU job
    assert vertex.starts[name] == 1 and vertex.jobs[name]["state"] == "JOB_STATE_SUCCEEDED"
    assert first.returncode == DIVERGED_EXIT and "Traceback" not in first.stderr, first.stderr[-3000:]
    last = job_log.strip().splitlines()[-1]
    assert first.stderr.strip().splitlines()[-1] == last  # the step's own line, where Vertex AI Pipelines shows it
    assert retried.returncode == DIVERGED_EXIT and retried.stderr.strip().splitlines()[-1] == last
    (verdict,) = (tmp_path / "verdicts").iterdir()  # in the task's folder, beside its model's
    assert tuple(json.loads(verdict.read_text())[key] for key in ("status", "step")) == (DIVERGED_EXIT, 5)
    assert "Traceback" not in job_log
    assert last.startswith("error: the training diverged: the loss is nan and the gradient norm nan at step 5 ")
    assert "(learning rate 8.33e+29); stopped, with no checkpoint or model written from these weights" in last
    assert "(the last good checkpoint: none)" in last
    assert last.endswith(
        "Try --on_divergence rewind (back to the last checkpoint, skipping the batches after it), or, in a new "
        "checkpoint_dir (a checkpoint folder keeps its recipe), a lower peak learning rate (--learning_rate, now "
        "1e+30) or tighter clipping (--clip_norm 0.5; now 1)"  # the default recipe clips at 1.0
    )
    checkpoints = tmp_path / "checkpoints"
    assert checkpoint_steps_all_finite(checkpoints) == []
    assert not (tmp_path / "model" / "tf_model.h5").exists() and not (tmp_path / "model" / SUMMARY_FILE).exists()
    # the attempt is a failure: a restart of the same job from the same place is refused after the second
    (attempt,) = json.loads((checkpoints / "attempts.json").read_text())
    assert attempt["outcome"] == "failed" and "Diverged: the training diverged" in attempt["error"]


def test_no_checkpoint_is_written_from_weights_that_are_not_finite(tmp_path, embedded_shards):
    """The weights blow up just before the second periodic checkpoint (step 20): it is not written, the first is
    kept as it was, and the run ends with status 4 and no model."""
    output = tmp_path / "model"
    result = run_at(["--function", SAVE, "--nth", "2", "--action", "nan"], *train_job(embedded_shards, output))
    assert result.returncode == DIVERGED_EXIT and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the model's weights are not finite at step 20: no checkpoint written; the last good one is "
        f"{output / 'checkpoints' / 'ckpt-10'}"
    )
    assert checkpoint_steps_all_finite(output / "checkpoints") == [10]
    assert not (output / "tf_model.h5").exists() and not (output / SUMMARY_FILE).exists()


def test_a_rewind_goes_back_to_the_last_checkpoint_skips_the_batches_after_it_and_goes_on(tmp_path, embedded_shards):
    """The weights blow up right after the checkpoint of step 10: the steps to 15 give a NaN loss; with
    ``--on_divergence rewind`` the run goes back to step 10, skips those batches, trains to its planned end and
    saves a finite model, the rewind in its log, history and summary."""
    output = tmp_path / "model"
    job = train_job(embedded_shards, output, "--on_divergence", "rewind", "--max_rewinds", "1")
    result = run_at(["--function", SAVE, "--nth", "1", "--after", "--action", "nan"], *job)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "diverged: the loss is nan and the gradient norm nan at step 15 (learning rate" in result.stderr
        and "rewind 1 of at most 1: back to the checkpoint of step 10, skipping the batches of steps 11 to 15"
        in result.stderr
    )
    summary = json.loads((output / SUMMARY_FILE).read_text())
    assert summary["rewinds"] == [{"at_step": 15, "to_step": 10}]
    assert summary["total_steps"] == 30
    assert [point["step"] for point in summary["history"]] == [5, 10, 15, 20, 25, 30]
    assert all(np.isfinite([point["loss"], point["gradient_norm"]]).all() for point in summary["history"])
    assert checkpoint_steps_all_finite(output / "checkpoints") == [10, 20, 30]
    from transformers import TFAutoModelForMaskedLM

    model = TFAutoModelForMaskedLM.from_pretrained(output, use_safetensors=False)
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
