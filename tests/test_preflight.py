import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT_ROOT

from components.errors import InvalidParameter
from components.preflight import PreflightArguments, preflight
from components.shards import read_manifest


def arguments(shards: dict, output: Path, **overrides) -> PreflightArguments:
    values = {
        "tokenizer": shards["tokenizer"],
        "train_shards": shards["train"],
        "eval_shards": shards["validation"],
        "output": str(output),
        "model_config": "tiny",
        "per_replica_batch_size": 16,
        "max_steps": 10,
    }
    return PreflightArguments(**{**values, **overrides})


def test_preflight_passes_and_reports_the_plan(tmp_path, wikitext_shards):
    report = preflight(arguments(wikitext_shards, tmp_path / "out", replicas=8))
    assert report["global_batch_size"] == 128 and report["total_steps"] == 10 and report["vocab_size"] == 5000
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


def test_preflight_refuses_unwritable_storage(tmp_path, wikitext_shards):
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(InvalidParameter, match=r"--output=.*a-file/out': is not writable"):
        preflight(arguments(wikitext_shards, tmp_path / "a-file" / "out"))


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
