"""run-local's quiet output: one line per step, the step's whole log in a file of the run (and on the screen
when the step fails), fill-mask pieces shown as people should read them."""

import io

import pytest

from components.lib.results import display_token, fill_mask_line
from pipelines.run_local import StepLines, display_names, run_quietly

# What kfp.local 2.17 writes while it runs a task (colours included), as it reaches sys.stdout.
KFP_TASK = (
    "14:00:00.000 - INFO - Executing task \x1b[96m'{task}'\x1b[0m\n"
    "14:00:00.001 - INFO - Streamed logs:\n\n"
    "    14:00:01 tpu_mlm.tokenizer: trained {task}\n"
    "    \n\n"
    "14:00:02.000 - INFO - Task \x1b[96m'{task}'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m\n"
    "14:00:02.001 - INFO - Task \x1b[96m'{task}'\x1b[0m outputs:\n"
    "    tokenizer: Artifact( name='tokenizer',\n"
    "                         uri='/runs/x/tokenizer',\n"
    "                         metadata={{'vocab_size': 5000, 'texts_read': 3}} )\n"
    "\n"
    "--------------------------------------------------------------------------------\n"
)


def test_one_line_per_task_and_each_task_log_in_the_run_folder(tmp_path):
    out = io.StringIO()
    run = tmp_path / "run"
    lines = StepLines(lambda: run if run.exists() else None, {"tokenizer-step": "tokenizer"}, out)
    lines.write("14:00:00 - INFO - Running pipeline\n")
    # the run's folder appears only once the first task has run: its lines wait in memory
    first = KFP_TASK.format(task="part-indices")
    lines.write(first[:50])
    lines.write(first[50:200])
    run.mkdir()
    lines.write(first[200:])
    lines.write(KFP_TASK.format(task="tokenizer-step"))

    printed = out.getvalue().splitlines()
    assert len(printed) == 2
    assert printed[0].split()[:2] == ["part-indices", "SUCCESS"]
    assert printed[1].split()[:2] == ["tokenizer", "SUCCESS"]  # the display name
    assert "5,000 pieces" in printed[1] and str(run / "logs" / "tokenizer-step.log") in printed[1]
    log = (run / "logs" / "part-indices.log").read_text()
    assert "trained part-indices" in log and "\x1b" not in log and "Running pipeline" not in log


def test_a_failing_step_prints_its_whole_log_and_the_error_goes_on(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()

    class FailingPipeline:
        pipeline_spec = None

        def __call__(self, **values):
            print("14:00:00.000 - INFO - Executing task \x1b[96m'train-step'\x1b[0m")
            print("    error: per_replica_batch_size=4096: more than the 1009 training samples")
            raise RuntimeError("Task 'train-step' finished with status FAILURE")

    with pytest.raises(RuntimeError, match="FAILURE"):
        run_quietly(FailingPipeline(), {}, lambda: run, labels={})
    shown = capsys.readouterr().err
    assert "train-step failed" in shown and "per_replica_batch_size=4096" in shown
    assert "per_replica_batch_size=4096" in (run / "logs" / "train-step.log").read_text()


def test_display_names_come_from_the_pipeline():
    from pipelines.pipeline import build_pipeline

    names = display_names(build_pipeline("local"))
    assert names["shards-step"] == "train shards part" and names["shards-step-2"] == "validation shards part"
    assert names["merge-shards-step-2"] == "merge validation shards"


def test_the_bare_word_boundary_piece_is_named():
    assert display_token("") == "\u2581 (word boundary)"
    assert display_token(" ") == "\u2581 (word boundary)"
    assert display_token("the") == "the"
    line = fill_mask_line([{"token": "", "score": 0.2269}, {"token": "the", "score": 0.0348}])
    assert line == "\u2581 (word boundary) (0.227), the (0.035)"
