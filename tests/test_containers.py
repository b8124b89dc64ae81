import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from conftest import HUB_TOKEN, PROJECT_ROOT

from pipelines import submit_smoke
from pipelines.run_local import RunLocalArguments, run_local

CPU_DOCKERFILE = PROJECT_ROOT / "containers" / "cpu.Dockerfile"
TPU_DOCKERFILE = PROJECT_ROOT / "containers" / "tpu.Dockerfile"
TEST_IMAGE = "tpu-mlm-cpu:test"
TPU_TEST_IMAGE = "tpu-mlm-tpu:test"


def pinned(name: str) -> str:
    dependencies = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d.split("==")[1] for d in dependencies if d.split("==")[0] == name)


def docker_engine() -> bool:
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    return subprocess.run(["docker", "version"], capture_output=True).returncode == 0


def build_image(dockerfile: Path, tag: str) -> None:
    """Builds the image from the project root as the README says, or skips where no engine runs."""
    if not docker_engine():
        pytest.skip(
            "no Docker engine: start one with ../shared/tools/docker-sandbox and export DOCKER_HOST (.ci/run does)"
        )
    build = subprocess.run(
        ["docker", "build", "--network", "host", "-f", str(dockerfile), "-t", tag, "."],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]


def test_tpu_image_pins_tensorflow_tpu_and_libtpu_and_sets_only_what_tensorflow_reads():
    text = TPU_DOCKERFILE.read_text()
    constraints = (PROJECT_ROOT / "constraints.txt").read_text()
    tpu_version = re.search(r"^tensorflow-tpu==(\S+)", constraints, re.M)[1]
    assert tpu_version.rsplit(".", 1)[0] == pinned("tensorflow").rsplit(".", 1)[0]  # the same minor as the CPU image
    assert re.search(r"^libtpu==0\.0\.\d+", constraints, re.M)  # pinned: pip would take the newest otherwise
    # tensorflow itself must not be installed beside tensorflow-tpu: it is filtered out of the pins
    assert "grep -vE '^(tensorflow|" in text and "pip install --no-deps -r /tmp/runtime.txt" in text
    assert "^(tensorflow-tpu|libtpu|" in CPU_DOCKERFILE.read_text()  # and the CPU image gets neither
    for variable in (
        "FORCE_TF_AVAILABLE=1",
        "NEXT_PLUGGABLE_DEVICE_USE_C_API=true",
        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so",
        "TF_USE_LEGACY_KERAS=1",
    ):
        assert variable in text
    assert "PJRT_DEVICE" not in text  # PyTorch/XLA's variable; TensorFlow does not read it
    assert 'mv "$site/libtpu/libtpu.so" /lib/libtpu.so' in text  # where Vertex AI wants it
    assert "assert transformers.is_tf_available()" in text and "create_optimizer(" in text
    assert 'CMD ["tpu-mlm", "train", "--help"]' in text


def test_both_images_install_the_project_from_its_resolved_pins():
    for dockerfile in (CPU_DOCKERFILE, TPU_DOCKERFILE):
        text = dockerfile.read_text()
        assert text.startswith("#") and "FROM python:3.11-slim" in text
        assert "COPY constraints.txt" in text and "pip install --no-deps ." in text
    constraints = (PROJECT_ROOT / "constraints.txt").read_text()
    assert f"tensorflow=={pinned('tensorflow')}" in constraints and f"kfp=={pinned('kfp')}" in constraints


@pytest.mark.slow
def test_the_local_pipeline_runs_in_the_cpu_image_through_docker_runner_and_pushes(tmp_path, monkeypatch, capsys, hub):
    build_image(CPU_DOCKERFILE, TEST_IMAGE)
    help_text = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", TEST_IMAGE, "python", "-m", "components.shards", "--help"],
        capture_output=True,
        text=True,
    )
    assert help_text.returncode == 0 and "--max_length" in help_text.stdout

    for name in ("HF_ENDPOINT", "HF_HUB_DISABLE_XET", "HF_TOKEN"):  # passed into the containers' environment
        monkeypatch.setenv(name, hub.env[name])
    summary = run_local(
        RunLocalArguments(
            pipeline_root=str(tmp_path / "runs"), docker=True, image=TEST_IMAGE, max_steps=20, hub_repo_id="user/boxed"
        )
    )
    artifacts = summary["artifacts"]
    manifest = Path(artifacts["train shards"], "manifest.json")
    assert manifest.exists() and Path(artifacts["model"], "tf_model.h5").exists()
    assert summary["metrics"]["masked_tokens"] > 0
    assert "data:image/png;base64," in Path(artifacts["run report"]).read_text()
    assert hub.file("user/boxed", "tf_model.h5") == Path(artifacts["model"], "tf_model.h5").read_bytes()
    printed = capsys.readouterr()
    assert HUB_TOKEN not in printed.out + printed.err  # the steps' logs, streamed from the containers


@pytest.mark.slow
def test_the_tpu_image_builds_trains_on_two_cpu_replicas_and_refuses_a_missing_tpu_in_one_line(
    tmp_path, embedded_shards
):
    build_image(TPU_DOCKERFILE, TPU_TEST_IMAGE)
    data = tmp_path / "data"
    for name in ("tokenizer", "train", "validation"):
        shutil.copytree(embedded_shards[name], data / name)

    def train(*arguments: str) -> subprocess.CompletedProcess:
        command = ["docker", "run", "--rm", "--network", "none", "-v", f"{data}:/data", TPU_TEST_IMAGE, "tpu-mlm"]
        command += ["train", "--tokenizer", "/data/tokenizer", "--train_shards", "/data/train", "--model_config"]
        return subprocess.run([*command, "tiny", *arguments], capture_output=True, text=True, timeout=600)

    trained = train(
        *("--eval_shards", "/data/validation", "--accelerator", "cpu", "--replicas", "2"),
        *("--per_replica_batch_size", "8", "--max_steps", "2", "--checkpoint_every_steps", "2"),
        *("--output", "/data/model"),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads((data / "model" / "training_summary.json").read_text())
    assert summary["replicas"] == 2 and summary["total_steps"] == 2 and (data / "model" / "tf_model.h5").exists()
    assert "validation loss" in trained.stderr

    refused = train("--accelerator", "tpu", "--output", "/data/tpu-model")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (
        refused.stderr.strip().splitlines()[-1].startswith("error: --accelerator='tpu': no TPU found at --tpu='local'")
    )
    assert not (data / "tpu-model").exists()

    # the smoke job's container as Vertex AI would start it (its command, arguments and environment) fails in
    # seconds off a TPU, with its report written: TensorFlow never waits on libtpu for a TPU that is not there
    job = submit_smoke.smoke_job(
        submit_smoke.SmokeJobArguments(
            project="my-project-123", scratch="gs://b/smoke", tpu_image="us-docker.pkg.dev/p/r/tpu:test"
        ),
        "/data/smoke",
    )
    container = job.job_spec.worker_pool_specs[0].container_spec
    environment = [option for variable in container.env for option in ("-e", f"{variable.name}={variable.value}")]
    docker = ["docker", "run", "--rm", "--network", "none", "-v", f"{data}:/data", *environment, TPU_TEST_IMAGE]
    smoked = subprocess.run(
        [*docker, *container.command, *container.args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert smoked.returncode == 0, smoked.stderr[-3000:]  # the verdict is the report's, not the exit's
    report = json.loads((data / "smoke" / "smoke.json").read_text())
    assert report["verdict"] == "fail" and report["failed_at"] == "runtime" and "no TPU found" in report["error"]
    assert report["stages"]["runtime"]["environment"]["TF_XLA_FLAGS"].startswith("--tf_mlir_enable_mlir_bridge=true")
    assert report["stages"]["runtime"]["packages"]["libtpu"] == "0.0.14"  # the constraints.txt pin, from inside
