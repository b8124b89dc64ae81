import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from conftest import HUB_TOKEN, LONG_TEST_SECONDS, PROJECT_ROOT

from components.lib.results import SUMMARY_FILE
from components.lib.tpu_catalogue import TPU_RUNTIMES
from pipelines import submit_smoke
from pipelines.run_local import RunLocalArguments, run_local

CPU_DOCKERFILE = PROJECT_ROOT / "containers" / "cpu.Dockerfile"
TPU_DOCKERFILE = PROJECT_ROOT / "containers" / "tpu.Dockerfile"
TEST_IMAGE = "tpu-mlm-cpu:test"
# under make test's processes, these tests run in one: each image is built once, and never twice at a time
pytestmark = pytest.mark.xdist_group("images")
DEFAULT_RUNTIME = TPU_RUNTIMES[0]
# the tests' tools and the installer: in no image
TEST_TOOLS = {
    "pytest",
    "pytest-timeout",
    "pytest-xdist",
    "execnet",
    "ruff",
    "gcp-storage-emulator",
    "iniconfig",
    "pluggy",
    "uv",
}


def pyproject() -> dict:
    """pyproject.toml's [project] table."""
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]


def pinned(name: str) -> str:
    """The project's pin of ``name`` (normalised: tf-keras, not tf_keras)."""
    return pins_of(pyproject()["dependencies"])[name]


def runtime_pins(runtime: str) -> Path:
    """The pins file the TPU image of ``runtime`` installs (containers/tpu.Dockerfile's RUNTIME)."""
    if runtime == DEFAULT_RUNTIME:
        return PROJECT_ROOT / "constraints.txt"
    return PROJECT_ROOT / "containers" / f"tpu-{runtime}.constraints.txt"


def pins(path: Path) -> dict[str, str]:
    """Name (normalised: tf-keras, not tf_keras) -> version, of a pins file."""
    return pins_of(path.read_text().splitlines())


def pins_of(lines: list[str]) -> dict[str, str]:
    found = [re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line) for line in lines]
    return {re.sub(r"[-_.]+", "-", pin[1].lower()): pin[2] for pin in found if pin}


def pin_group(group: str, runtime: str = DEFAULT_RUNTIME) -> dict[str, str]:
    """What an image installs of a runtime's pins for one of its dependency layers (containers/pins.sh)."""
    printed = subprocess.run(
        ["sh", "containers/pins.sh", group],
        cwd=PROJECT_ROOT,
        env={**os.environ, "RUNTIME": runtime},
        capture_output=True,
        text=True,
        check=True,
    )
    return pins_of(printed.stdout.splitlines())


def instructions(dockerfile: Path) -> list[str]:
    """The Dockerfile's instructions, comments left out and continued lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def tpu_test_image(runtime: str) -> str:
    """The test's tag of the TPU image of ``runtime``, named as make tpu-image names them."""
    return "tpu-mlm-tpu:test" if runtime == DEFAULT_RUNTIME else f"tpu-mlm-tpu-{runtime}:test"


def docker_engine() -> bool:
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    return subprocess.run(["docker", "version"], capture_output=True).returncode == 0


def build_image(dockerfile: Path, tag: str, *build_args: str) -> None:
    """Builds the image from the project root as the README says, or skips where no engine runs."""
    if not docker_engine():
        pytest.skip(
            "no Docker engine: start one with ../shared/tools/docker-sandbox and export DOCKER_HOST (.ci/run does)"
        )
    build = subprocess.run(
        ["docker", "build", "--network", "host", "-f", str(dockerfile), "-t", tag]
        + [option for build_arg in build_args for option in ("--build-arg", build_arg)]
        + ["."],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]


def test_make_test_s_processes_run_these_tests_in_one_of_them(request):
    """The group holds only if pytest-xdist marks each grouped test's id: under pytest 9.2 it silently does not
    (pytest-dev/pytest-xdist#1386), and each image was built in another process, all three at once."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and request.config.option.loadgroup):
        pytest.skip("not under make test's processes (pytest-xdist, --dist loadgroup)")
    assert request.node.nodeid.endswith("@images"), f"not grouped under pytest {pytest.__version__} (constraints.txt)"


@pytest.mark.parametrize("runtime", TPU_RUNTIMES)
def test_each_tpu_runtime_pins_tensorflow_tpu_libtpu_and_keras_of_one_minor(runtime):
    found = pins(runtime_pins(runtime))
    assert f"tf{minor(found['tensorflow-tpu'])}" == runtime  # the name the TPU-init error derives from the version
    assert re.fullmatch(r"0\.0\.\d+", found["libtpu"])  # pinned: pip would take the newest otherwise
    assert minor(found["tf-keras"]) == minor(found["tensorboard"]) == minor(found["tensorflow-tpu"])
    # the TPU image's layers: every pin but the tests' tools, tensorflow-tpu and never tensorflow beside it
    common, tpu = pin_group("common", runtime), pin_group("tpu", runtime)
    installed = {**common, **tpu}
    assert set(tpu) == {"tensorflow-tpu", "libtpu"} and not set(common) & set(tpu)
    assert "tensorflow" not in installed and {"kfp", "transformers"} <= set(installed)
    assert set(installed) == set(found) - {"tensorflow"} - TEST_TOOLS
    if runtime == DEFAULT_RUNTIME:  # the project's own pins: the CPU image's TensorFlow minor
        assert minor(found["tensorflow-tpu"]) == minor(pinned("tensorflow")) and found["kfp"] == pinned("kfp")


def test_the_tpu_runtimes_are_named_alike_in_the_code_makefile_and_dockerfile():
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert re.search(r"^TPU_RUNTIMES := (.+)$", makefile, re.M)[1].split() == list(TPU_RUNTIMES)
    for dockerfile in (CPU_DOCKERFILE, TPU_DOCKERFILE):
        assert f"ARG RUNTIME={DEFAULT_RUNTIME}" in instructions(dockerfile)
    script = (PROJECT_ROOT / "containers" / "pins.sh").read_text()
    assert f"runtime=${{RUNTIME:-{DEFAULT_RUNTIME}}}" in script and f'if [ "$runtime" != {DEFAULT_RUNTIME} ]' in script
    for runtime in TPU_RUNTIMES:  # each runtime's pins found where the images copy them
        assert pin_group("tpu", runtime) == {
            name: pins(runtime_pins(runtime))[name] for name in ("tensorflow-tpu", "libtpu")
        }
    unknown = subprocess.run(
        ["sh", "containers/pins.sh", "tpu"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "RUNTIME": "tf9.9"},
        capture_output=True,
    )
    assert unknown.returncode == 1 and b"RUNTIME=tf9.9: no containers/tpu-tf9.9.constraints.txt" in unknown.stderr


def test_the_cpu_and_tpu_images_share_their_dependency_layer_and_the_cpu_image_gets_cpu_tensorflow():
    """Docker reuses a layer for the same instructions on the same parent: the CPU and the default TPU image
    install everything but TensorFlow once on a machine that builds both (CI builds all three)."""
    cpu, tpu = instructions(CPU_DOCKERFILE), instructions(TPU_DOCKERFILE)
    shared = cpu[: cpu.index(next(line for line in cpu if "pins.sh common" in line)) + 1]
    assert tpu[: len(shared)] == shared and shared[0] == "FROM python:3.11-slim"
    assert {"tensorflow"} == set(pin_group("tensorflow")) and not set(pin_group("common")) & {"tensorflow", "libtpu"}
    assert any("pins.sh tensorflow" in line for line in cpu) and not any("pins.sh tpu" in line for line in cpu)


def test_tpu_image_sets_only_what_tensorflow_reads():
    text = TPU_DOCKERFILE.read_text()
    assert any("pins.sh tpu" in line for line in instructions(TPU_DOCKERFILE))
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


def test_make_images_builds_every_image_for_vertex_ai_s_x86_machines_whatever_the_host():
    printed = subprocess.run(
        ["make", "-n", "images", "CPU_IMAGE=r/cpu:1", "TPU_IMAGE=r/tpu:1"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    builds = [line for line in printed.splitlines() if line.startswith("docker build")]
    assert [line.split(" -t ")[1].split()[0] for line in builds] == ["r/cpu:1", "r/tpu:1", "r/tpu-tf2.19:1"]
    assert all("--platform linux/amd64" in line for line in builds)  # an ARM laptop's own would not run there


def test_pyproject_pins_what_constraints_txt_resolved():
    """A pin changed in one of the two files alone makes make install unsatisfiable (or an image differ from the
    tests' environment): each of pyproject.toml's pins, the dev tools' too, is constraints.txt's."""
    project = pyproject()
    declared = pins_of(project["dependencies"] + project["optional-dependencies"]["dev"])
    resolved = pins(PROJECT_ROOT / "constraints.txt")
    assert len(declared) == len(project["dependencies"]) + len(project["optional-dependencies"]["dev"])
    differing = {name: (pin, resolved.get(name)) for name, pin in declared.items() if resolved.get(name) != pin}
    assert differing == {}, f"pyproject.toml's pin, constraints.txt's: {differing}"


def test_both_images_install_the_project_from_its_resolved_pins():
    for dockerfile in (CPU_DOCKERFILE, TPU_DOCKERFILE):
        text = dockerfile.read_text()
        assert text.startswith("#") and "FROM python:3.11-slim" in text
        assert "COPY constraints.txt" in text and "pip install --no-deps ." in text
    constraints = (PROJECT_ROOT / "constraints.txt").read_text()
    assert f"tensorflow=={pinned('tensorflow')}" in constraints and f"kfp=={pinned('kfp')}" in constraints


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_the_local_pipeline_runs_in_the_cpu_image_through_docker_runner_and_pushes(tmp_path, monkeypatch, capsys, hub):
    build_image(CPU_DOCKERFILE, TEST_IMAGE)
    help_text = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", TEST_IMAGE, "python", "-m", "components.shards", "--help"],
        capture_output=True,
        text=True,
    )
    assert help_text.returncode == 0 and "--max_length" in help_text.stdout
    # the pipeline's TPU task launcher runs in this image on Vertex AI, with GCPC's launcher's arguments
    launcher = ["python", "-m", "pipelines.launch_custom_job", "--help"]
    launcher_help = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", TEST_IMAGE, *launcher], capture_output=True, text=True
    )
    assert launcher_help.returncode == 0 and "--gcp_resources" in launcher_help.stdout

    for name in ("HF_ENDPOINT", "HF_HUB_DISABLE_XET", "HF_TOKEN"):  # passed into the containers' environment
        monkeypatch.setenv(name, hub.env[name])
    # the tiny model for a few steps: what this test is about is the image, not the learning (tests/test_pipeline.py)
    boxed = {"model_config": "tiny", "per_replica_batch_size": 16, "max_steps": 20, "hub_repo_id": "user/boxed"}
    boxed |= {"downstream_max_steps": 2, "downstream_max_train_samples": 32, "downstream_seeds": "1"}
    summary = run_local(RunLocalArguments(pipeline_root=str(tmp_path / "runs"), docker=True, image=TEST_IMAGE, **boxed))
    artifacts = summary["artifacts"]
    manifest = Path(artifacts["train shards"], "manifest.json")
    assert manifest.exists() and Path(artifacts["model"], "tf_model.h5").exists()
    assert summary["metrics"]["masked_tokens"] > 0
    assert "data:image/png;base64," in Path(artifacts["run report"]).read_text()
    assert hub.file("user/boxed", "tf_model.h5") == Path(artifacts["model"], "tf_model.h5").read_bytes()
    probe = json.loads(Path(artifacts["downstream probe"], "downstream.json").read_text())  # fine-tuned in the image
    assert probe["tasks"][0]["pre-trained"]["runs"][0]["steps"] == 2
    printed = capsys.readouterr()
    assert HUB_TOKEN not in printed.out + printed.err  # the steps' logs, streamed from the containers


def train_through_the_kfp_executor(image: str, root: Path, data: Path) -> Path:
    """The train component as the project's kfp compiles it, run in ``image`` by kfp.local's DockerRunner: the
    image's own kfp executor reads the executor input and runs the step, as on Vertex AI. Returns its model
    folder."""
    from kfp import dsl, local

    from pipelines.steps import make_steps

    local.init(runner=local.DockerRunner(network_mode="none"), pipeline_root=str(root))  # mounted as it is
    train = make_steps(image, image)["train"]

    def imported(name: str, kind: type):  # the importer task's artifact
        return dsl.importer(artifact_uri=str(data / name), artifact_class=kind, reimport=False).output

    @dsl.pipeline(name="train-by-the-executor")
    def train_only():
        train(
            tokenizer=imported("tokenizer", dsl.Artifact),
            train_shards=imported("train", dsl.Dataset),
            eval_shards=imported("validation", dsl.Dataset),
            model_config="tiny",
            accelerator="cpu",
            replicas=2,
            per_replica_batch_size=8,
            max_steps=2,
            checkpoint_every_steps=2,
            checkpoint_dir=str(root / "executor-checkpoints"),
        )

    train_only()
    (summary,) = root.glob(f"train-by-the-executor-*/train-step/model/{SUMMARY_FILE}")
    return summary.parent


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
@pytest.mark.parametrize("runtime", TPU_RUNTIMES)
def test_the_tpu_image_builds_trains_on_two_cpu_replicas_and_refuses_a_missing_tpu_in_one_line(
    tmp_path, embedded_shards, runtime
):
    image = tpu_test_image(runtime)
    build_image(TPU_DOCKERFILE, image, f"RUNTIME={runtime}")
    data = tmp_path / "data"
    for name in ("tokenizer", "train", "validation"):
        shutil.copytree(embedded_shards[name], data / name)

    def train(*arguments: str) -> subprocess.CompletedProcess:
        command = ["docker", "run", "--rm", "--network", "none", "-v", f"{data}:/data", image, "tpu-mlm"]
        command += ["train", "--tokenizer", "/data/tokenizer", "--train_shards", "/data/train", "--model_config"]
        return subprocess.run([*command, "tiny", *arguments], capture_output=True, text=True, timeout=600)

    # one training per image: an image whose kfp is older than the project's trains through its own kfp executor
    # (what the project's kfp compiles, run as on Vertex AI), the other by its console script
    if pins(runtime_pins(runtime))["kfp"] != pinned("kfp"):
        model = train_through_the_kfp_executor(image, tmp_path, data)
    else:
        trained = train(
            *("--eval_shards", "/data/validation", "--accelerator", "cpu", "--replicas", "2"),
            *("--per_replica_batch_size", "8", "--max_steps", "2", "--checkpoint_every_steps", "2"),
            *("--output", "/data/model"),
        )
        assert trained.returncode == 0, trained.stderr[-3000:]
        model = data / "model"
    summary = json.loads((model / SUMMARY_FILE).read_text())
    assert summary["replicas"] == 2 and summary["total_steps"] == 2 and (model / "tf_model.h5").exists()
    assert summary["accelerator"] == "cpu" and "eval_loss" in summary["history"][-1]  # validated at its checkpoint

    refused = train("--accelerator", "tpu", "--output", "/data/tpu-model")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (
        refused.stderr.strip().splitlines()[-1].startswith("error: --accelerator='tpu': no TPU found at --tpu='local'")
    )
    assert not (data / "tpu-model").exists()

    # the smoke job's container as Vertex AI would start it (its command, arguments and environment) fails in
    # seconds off a TPU, with its report written: TensorFlow never waits on libtpu for a TPU that is not there
    job = submit_smoke.smoke_custom_job(
        submit_smoke.SmokeJobArguments(
            project="my-project-123", scratch="gs://b/smoke", tpu_image="us-docker.pkg.dev/p/r/tpu:test"
        ),
        "/data/smoke",
    )
    container = job.job_spec.worker_pool_specs[0].container_spec
    environment = [option for variable in container.env for option in ("-e", f"{variable.name}={variable.value}")]
    docker = ["docker", "run", "--rm", "--network", "none", "-v", f"{data}:/data", *environment, image]
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
    # the runtime pair it ran, read from inside, is its pins file's; and its log says so
    pinned_pair, packages = pins(runtime_pins(runtime)), report["stages"]["runtime"]["packages"]
    assert all(packages[name] == pinned_pair[name] for name in ("tensorflow-tpu", "libtpu"))
    pair = f"tensorflow-tpu {pinned_pair['tensorflow-tpu']}, libtpu {pinned_pair['libtpu']}"
    assert f"runtime: {pair}, transformers" in smoked.stderr
