"""Rewinds that hold across restarts: ``--max_rewinds`` counts every rewind of the training, whichever job made it
(``rewinds.json`` beside the checkpoints, written at the rewind); a checkpoint asked for from weights that are not
finite rewinds under ``--on_divergence rewind`` instead of stopping; a step's point is not written to TensorBoard
twice, by a rewind or by a restarted job. Each run is the train step's own command on the tiny model, the weights
set to NaN at a chosen call and the process SIGKILLed at another (``tests/kill_at.py``'s actions, two armed in one
process)."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import tensorflow as tf
from conftest import PROJECT_ROOT, run_at
from test_divergence import SAVE, checkpoint_steps_all_finite, train_job

from components.lib.job_runner import DIVERGED_EXIT
from components.lib.training_state import REWINDS_FILE


def run_armed(arms: list[tuple[int, str]], command: list[str]) -> subprocess.CompletedProcess:
    """Runs the job ``command`` with ``TrainingState.save`` armed once for each (nth call, action), just before
    the call, as ``tests/kill_at.py`` arms one."""
    armed = "".join(f"kill_at.arm({SAVE!r}, '', {nth}, False, {action!r}); " for nth, action in arms)
    module, *arguments = command
    script = (
        f"import importlib, sys; import kill_at; {armed}"
        f"sys.exit(importlib.import_module({module!r}).main({arguments!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{PROJECT_ROOT}{os.pathsep}{PROJECT_ROOT / 'tests'}"},
    )


def tensorboard_steps(folder, tag: str) -> list[int]:
    """The steps of every point of ``tag`` in the event files under ``folder``, in the order they were written."""
    steps = []
    for events in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


@pytest.mark.slow  # two trainings, each in a process of its own
def test_rewinds_are_counted_across_jobs_and_a_non_finite_checkpoint_rewinds(tmp_path, embedded_shards):
    """The first job: the weights blow up just before the checkpoint of step 20, which is not written: the job
    rewinds to step 10 (rewind 1 of at most 1), is SIGKILLed at its next checkpoint, before any is written. The
    restarted job resumes from step 10, and the next blow-up stops it: the first job's rewind counts."""
    output = tmp_path / "model"
    job = train_job(embedded_shards, output, "--on_divergence", "rewind", "--max_rewinds", "1")
    first = run_armed([(2, "nan"), (3, "kill")], job)  # save 2: step 20, NaN; save 3: step 20 again, killed
    assert first.returncode == -9, first.stderr[-3000:]
    assert (
        "diverged: the model's weights are not finite at step 20 (learning rate" in first.stderr
        and "rewind 1 of at most 1: back to the checkpoint of step 10, skipping the batches of steps 11 to 20"
        in first.stderr
    )
    checkpoints = output / "checkpoints"
    assert checkpoint_steps_all_finite(checkpoints) == [10]  # nothing written from the weights that were not finite
    assert json.loads((checkpoints / REWINDS_FILE).read_text()) == [{"at_step": 20, "to_step": 10}]
    # steps 15 and 20 were trained twice (before and after the rewind): TensorBoard has one point of each
    logs = output / "logs"
    assert tensorboard_steps(logs, "train/loss") == [5, 10, 15, 20]

    restarted = run_at(["--function", SAVE, "--nth", "1", "--action", "nan"], *job)
    assert restarted.returncode == DIVERGED_EXIT and "Traceback" not in restarted.stderr, restarted.stderr[-3000:]
    assert "resuming from" in restarted.stderr and "at step 10 of 30" in restarted.stderr
    last = restarted.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the training diverged: the model's weights are not finite at step 20 (learning")
    assert "stopped (1 rewind(s) done in this training, its earlier jobs' included, at most 1)" in last
    assert checkpoint_steps_all_finite(checkpoints) == [10]
    # the restarted job trained steps 11 to 20 again: TensorBoard still has one point of each
    assert tensorboard_steps(logs, "train/loss") == [5, 10, 15, 20]


def test_tensorboard_keeps_both_points_of_a_step_written_twice(tmp_path):
    """Why the train step writes a rewound step's point once: TensorBoard's loader purges earlier points only on a
    SessionLog.START event, which TF2's summary writers never write, so a step written twice shows twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step in (5, 10, 15, 10, 15, 20):  # a rewind from 15 to 10, written again
            tf.summary.scalar("train/loss", float(step), step=step)
    writer.flush()
    loaded = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0}).Reload()
    assert Counter(point.step for point in loaded.Tensors("train/loss")) == {5: 1, 10: 2, 15: 2, 20: 1}
