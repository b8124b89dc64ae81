import importlib
import json
import runpy
import subprocess
import sys

import pytest
from conftest import PROJECT_ROOT, run_module

from components import shards


@pytest.mark.parametrize(
    "module",
    [
        "components.tokenizer",
        "components.shards",
        "components.merge_shards",
        "components.train",
        "components.evaluate",
        "components.downstream",
        "components.preflight",
        "components.push",
        "components.report",
        "components.slice",
        "components.tpu_worker",
        "pipelines.run_local",
        "pipelines.compile",
        "pipelines.smoke_job",
        "pipelines.submit_smoke",
        "pipelines.runs status",
        "pipelines.runs logs",
        "pipelines.runs cancel",
        "pipelines.clean",
    ],
)
@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # imported by earlier tests
def test_every_component_runs_as_a_module_with_help(module, monkeypatch, capsys):
    """``python -m module --help`` as runpy runs it, in this process (``test_console_script_lists_jobs_and_dispatches``
    and the jobs' own tests run them in processes of their own)."""
    module, *job = module.split()  # a module of several jobs: python -m MODULE JOB --help
    monkeypatch.setattr(sys, "argv", [module, *job, "--help"])
    with pytest.raises(SystemExit) as exit:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exit.value.code in (0, None), capsys.readouterr().err
    # what it runs as, and what it is: its module's docstring, or for one of a module's jobs, its own help
    described = f"usage: python -m {' '.join([module, *job])} [-h]"
    if not job:
        described = importlib.import_module(module).__doc__.strip().splitlines()[0][:40]
    printed = capsys.readouterr().out
    assert printed.startswith("usage:") and described in " ".join(printed.split())


@pytest.mark.parametrize("script", sorted(path.name for path in (PROJECT_ROOT / "benchmarks").glob("*.py")))
def test_every_benchmark_explains_its_flags(script, monkeypatch, capsys):
    path = str(PROJECT_ROOT / "benchmarks" / script)
    monkeypatch.setattr(sys, "argv", [path, "--help"])
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "benchmarks"))  # as python benchmarks/SCRIPT has it
    with pytest.raises(SystemExit) as exit:
        runpy.run_path(path, run_name="__main__")
    assert exit.value.code in (0, None) and capsys.readouterr().out.startswith("usage:")


def test_importing_the_components_does_not_import_tensorflow():
    probe = (
        "import sys, components.shards, components.tokenizer, components.train, components.evaluate, "
        "components.downstream, pipelines.pipeline; print('tensorflow' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_console_script_lists_jobs_and_dispatches(tmp_path):
    assert run_module("pipelines.cli", "--help").returncode == 0
    result = run_module("pipelines.cli")
    assert result.returncode == 2
    assert "tokenizer" in result.stdout and "shards" in result.stdout
    result = run_module("pipelines.cli", "tokenizer", "--output", str(tmp_path / "tok"), "--vocab_size", "3")
    assert result.returncode == 2
    assert "error: --vocab-size=3: must be larger than the 5 special tokens" in result.stderr
    assert not (tmp_path / "tok").exists()


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_command_ends_with_a_few_lines_for_people_and_the_whole_summary_behind_json(
    tmp_path, embedded_tokenizer, capsys
):
    flags = ["--corpus", "embedded", "--tokenizer", embedded_tokenizer, "--max_length", "32"]
    people = run_module("components.shards", *flags, "--output", str(tmp_path / "people"))
    assert people.returncode == 0, people.stderr[-2000:]
    lines = people.stdout.strip().splitlines()
    # what was made, and where: not the manifest's token counts (one per piece, 3,000 here)
    assert len(lines) == 2 and "token_counts" not in people.stdout, lines
    capsys.readouterr()
    assert shards.main([*flags, "--output", str(tmp_path / "scripts"), "--json"]) == 0  # the same job in this process
    manifest = json.loads(capsys.readouterr().out)
    assert len(manifest["token_counts"]) == 3000 and manifest["num_records"] > 0
    assert lines == [
        f"the shard set: {manifest['num_records']:,} samples of 32 tokens in {len(manifest['files'])} file(s), "
        f"{manifest['tokens_dropped']:,} tokens dropped (the full record: manifest.json, or --json)",
        f"output: {tmp_path / 'people'}",
    ]
