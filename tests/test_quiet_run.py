"""run-local's quiet output: one line per step, the step's whole log in a file of the run, a failing step's one
line and exit status as run-local's own, bad parameters refused before the first step, fill-mask pieces shown as
people should read them."""

import io
from pathlib import Path

import pytest
from conftest import run_module

from components.lib.results import display_token, fill_mask_line
from pipelines.run_local import FailedStep, StepLines, display_names

STEP_SECONDS = 120  # a bound for run-local's first steps on a busy machine, not their time

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


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_failing_step_ends_run_local_with_its_one_line_and_its_exit_status(tmp_path):
    """A missing corpus fails the tokenizer step, the first that reads it, under kfp.local: run-local prints the
    step's line, then the step's own one line, no traceback, and exits 2 as the step did (bad input)."""
    missing = tmp_path / "missing.txt"
    failed = run_module(
        "pipelines.run_local", "--corpus", str(missing), "--pipeline_root", str(tmp_path / "runs"), timeout=STEP_SECONDS
    )
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr and "finished with status" not in failed.stderr
    *steps, last = failed.stderr.strip().splitlines()
    assert last.startswith(f"error: --corpus='{missing}': no file matches this path")
    (tokenizer,) = [line for line in steps if line.startswith("tokenizer ")]
    assert tokenizer.split()[1] == "FAILURE"
    log = tokenizer.split()[-1]  # the step's whole log, named on its line
    assert last in Path(log).read_text()


def test_a_step_that_printed_no_one_line_shows_its_log_s_end(tmp_path, capsys):
    """A crash (a traceback, no ``error:`` line): the end of its log, then a line naming its status and log."""
    lines = ["Executing task", *(f"frame {number}" for number in range(30)), "MemoryError", "---"]
    failure = FailedStep("train", lines, tmp_path / "train-step.log").failure(137)
    assert failure.status == 137
    assert str(failure) == f"train failed (exit status 137); its whole log: {tmp_path / 'train-step.log'}"
    shown = capsys.readouterr().err.splitlines()
    assert shown[-1] == "MemoryError" and len(shown) == 20 and "Executing task" not in shown


def test_run_local_refuses_a_wrong_model_name_before_the_first_step(tmp_path):
    """As submit does: the model config is loaded before any step runs, in one line, and no run is made."""
    refused = run_module(
        "pipelines.run_local",
        "--model_config",
        "roberta-bse",
        "--pipeline_root",
        str(tmp_path / "runs"),
        timeout=STEP_SECONDS,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --model-config='roberta-bse': unknown preset; use one of ['mini', 'roberta-base', 'roberta-large', "
        "'tiny'], a config.json path or URI, or a Hub model name"
    ]
    assert not (tmp_path / "runs").exists()


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
