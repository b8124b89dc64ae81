"""The verdict of a step inside a Vertex AI custom job (``components/lib/verdict.py``): where the pipeline's launcher
named a verdict file and Vertex AI set the job's id, an outcome that would repeat is written there and the process
ends with status 0 (Vertex AI restarts a worker that exits non-zero); anywhere else the statuses stay 2, 3 and 4.
The launcher's side, with Vertex AI's restarts, is in test_launch_custom_job.py."""

import json

import pytest
from kfp import dsl

from components import slice as slice_launcher
from components.lib import verdict
from components.lib.job_runner import job_exit_status
from pipelines.runners import run_train

JOB = {"CLOUD_ML_JOB_ID": "1234567890"}


def job_environment(monkeypatch, **variables: str) -> None:
    for name in ("CLOUD_ML_JOB_ID", verdict.VERDICT_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("where", ["launcher's job", "terminal", "pipeline CPU step", "unwritable"])
def test_a_refusal_ends_a_vertex_ai_job_cleanly_with_its_verdict_and_exits_2_anywhere_else(
    tmp_path, monkeypatch, capsys, where
):
    """The slice launcher refuses a one-host TPU (bad input): in the launcher's job (its verdict file named), exit 0
    and the verdict; in a terminal, in a pipeline's CPU step (a Vertex AI job, no verdict file named) and where the
    file cannot be written, exit 2 as before."""
    file = tmp_path / "verdicts" / "job.json"
    if where == "unwritable":
        (tmp_path / "verdicts").write_text("a file where the folder would be")
    environment = {
        "launcher's job": {**JOB, verdict.VERDICT_VARIABLE: str(file)},
        "terminal": {},
        "pipeline CPU step": JOB,
        "unwritable": {**JOB, verdict.VERDICT_VARIABLE: str(file)},
    }[where]
    job_environment(monkeypatch, **environment)
    status = slice_launcher.main(["--tpu_type", "v3-8", "--", "python", "-m", "components.train"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == "error: --tpu-type='v3-8': is one host: run the command itself"
    if where != "launcher's job":
        assert status == 2 and not file.is_file()
        return
    assert status == 0
    written = json.loads(file.read_text())
    assert (written["status"], written["line"], written["job"]) == (2, line.removeprefix("error: "), "1234567890")
    line = line.removeprefix("error: ")
    assert verdict.read(str(file)) == verdict.Verdict(2, line, job="1234567890", written=written["written"])


def test_an_unresolved_run_name_in_the_tpu_job_is_a_verdict_not_a_restart(tmp_path, monkeypatch, capsys):
    """The train component's runner, under the component's own exit mapping: a run name the backend did not fill in
    is refused before any TPU time, as a verdict inside the launcher's job (the process exits 0)."""
    file = tmp_path / "verdict.json"
    job_environment(monkeypatch, **JOB, **{verdict.VERDICT_VARIABLE: str(file)})
    values = {"run_name": "{{$.pipeline_job_name}}", "pipeline_root": "gs://b/root"}
    artifacts = {name: dsl.Artifact(uri=str(tmp_path / name)) for name in ("tokenizer", "train_shards", "eval_shards")}
    with pytest.raises(SystemExit) as ended, job_exit_status(values.values()):
        run_train(
            **artifacts,
            model=dsl.Model(uri=str(tmp_path / "model")),
            output_root="",
            tpu_type="v5e-8",
            tpu_provisioning="STANDARD",
            price_per_hour=0.0,
            checkpoint_dir="",
            **values,
        )
    assert ended.value.code == 0
    assert verdict.read(str(file)).status == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: --run-name='{{$.pipeline_job_name}}': was not resolved by the pipeline's backend")
    )
