"""Shared fixtures: real corpora (WikiText-2 from ../shared/data, the embedded pydoc text) and tokenizers.

Tests written for WikiText-2 run on the embedded corpus where ../shared/data is absent (a fresh clone): the
header of the test run says which one they got."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import components  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any test imports TensorFlow)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
WIKITEXT = SHARED_DATA / "wikitext-2"


def wikitext_present() -> bool:
    return (WIKITEXT / "valid.txt").exists() and not os.environ.get("TPU_MLM_TESTS_WITHOUT_SHARED_DATA")


# The WikiText-2 tokenizer's vocabulary (the stand-in below reaches it too).
WIKITEXT_VOCAB_SIZE = 5000


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first (an image's build, a whole pipeline: those given LONG_TEST_SECONDS), then files with
    slow tests, each file's tests in order: after xdist's groups (which it hands out first, the largest first: the
    images' tests), make test's processes start the longest work instead of one of them ending the run alone on it."""

    def is_long(item: pytest.Item) -> bool:
        limit = item.get_closest_marker("timeout")
        return limit is not None and limit.args[:1] == (LONG_TEST_SECONDS,)

    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (not is_long(item), item.path not in slow_files))  # stable: otherwise in order


def pytest_report_header() -> str:
    if wikitext_present():
        return f"WikiText-2 tests: {WIKITEXT}"
    return f"WikiText-2 tests: on the embedded corpus ({WIKITEXT} is absent)"


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """The folder ``name`` that ``make`` fills, made once per test run: make test's processes (pytest-xdist
    workers) share it, the first making it while the others wait on its lock. Tests read it, never change it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a process stopped while making it left
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    """The pipeline compiled for Vertex AI on a v5e-4, with images named as a registry's, for what submits it."""
    from pipelines.pipeline import compile_pipeline

    return compile_pipeline(
        str(tmp_path_factory.mktemp("template") / "pipeline.yaml"),
        target="vertex",
        cpu_image="us-docker.pkg.dev/p/r/cpu:1",
        tpu_image="us-docker.pkg.dev/p/r/tpu:1",
        tpu_type="v5e-4",
    )


@pytest.fixture(scope="session")
def wikitext(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """WikiText-2's valid.txt and test.txt; CI has them beside the checkout. Where they are absent, a stand-in
    of about their sizes made of the embedded corpus: its texts twice as valid.txt (the training text of the
    tests), three quarters of them as test.txt."""
    if wikitext_present():
        return WIKITEXT
    from components.lib.corpus import Corpus, CorpusSpec

    texts = list(Corpus(CorpusSpec(corpus="embedded")))
    folder = tmp_path_factory.mktemp("wikitext-stand-in")
    (folder / "valid.txt").write_text("\n".join(texts + texts) + "\n")
    (folder / "test.txt").write_text("\n".join(texts[: len(texts) * 3 // 4]) + "\n")  # one shard file, as 600 texts
    return folder


@pytest.fixture(scope="session")
def embedded_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tokenizer trained on the embedded corpus, shared by the tests that only need some tokenizer."""
    from components.tokenizer import TokenizerArguments, train_tokenizer

    def make(folder: Path) -> None:
        train_tokenizer(TokenizerArguments(output=str(folder / "tokenizer"), corpus="embedded", vocab_size=3000))

    return str(made_once(tmp_path_factory, "embedded", make) / "tokenizer")


def embedded_shard_set(root: Path, tokenizer: str, records_per_shard: dict[str, int] | None = None) -> dict:
    """Training shards of the embedded corpus and its held-out 5% as validation shards, under ``root``;
    ``records_per_shard``: samples a file, by split (default: the shards step's)."""
    from components.shards import ShardArguments, write_shards

    for split, holdout in (("train", "exclude"), ("validation", "only")):
        files = {"records_per_shard": records_per_shard[split]} if records_per_shard else {}
        write_shards(
            ShardArguments(
                output=str(root / split),
                tokenizer=tokenizer,
                corpus="embedded",
                split=split,
                holdout_fraction=0.05,
                holdout=holdout,
                **files,
            )
        )
    return embedded_shard_set_paths(root, tokenizer)


def embedded_shard_set_paths(root: Path, tokenizer: str) -> dict:
    return {"train": str(root / "train"), "validation": str(root / "validation"), "tokenizer": tokenizer}


@pytest.fixture(scope="session")
def embedded_shards(tmp_path_factory: pytest.TempPathFactory, embedded_tokenizer: str) -> dict:
    """Train shards and held-out validation shards of the embedded corpus: about 1,000 and 50 samples."""
    root = made_once(tmp_path_factory, "embedded-shards", lambda folder: embedded_shard_set(folder, embedded_tokenizer))
    return embedded_shard_set_paths(root, embedded_tokenizer)


@pytest.fixture(scope="session")
def embedded_shards_in_files(tmp_path_factory: pytest.TempPathFactory, embedded_tokenizer: str) -> dict:
    """The embedded corpus's shards in many small files, as a slice's hosts read them (each host a share): about
    1,000 training samples in 12 files, 50 validation samples in 5."""

    def make(folder: Path) -> None:
        embedded_shard_set(folder, embedded_tokenizer, {"train": 90, "validation": 11})

    return embedded_shard_set_paths(made_once(tmp_path_factory, "embedded-shards-in-files", make), embedded_tokenizer)


# a whole pipeline, an image built from nothing: the few tests given this limit (pytest.mark.timeout); every
# other test has pyproject.toml's, so a hang fails in minutes with its stack
LONG_TEST_SECONDS = 900

# the tests' own trainings: the tiny model on the CPU, 16 samples a step (train_tiny)
TINY_TRAINING = {"model_config": "tiny", "per_replica_batch_size": 16, "accelerator": "cpu"}


def train_tiny(output: Path | str, shards: dict, **settings) -> dict:
    """The train step on the tiny model on the CPU (``TINY_TRAINING``, then ``settings``) on the training shards
    of ``shards`` (a shard set fixture's dict); returns its summary."""
    from components.train import TrainArguments, train

    arguments = {"tokenizer": shards["tokenizer"], "train_shards": shards["train"], **TINY_TRAINING, **settings}
    return train(TrainArguments(output=str(output), **arguments))


def scheduled_rates(summary: dict) -> list[float]:
    """The learning rate the run's schedule gives at each point of its summary's history, by the point's step: a
    resumed run's must go on from its checkpoint's step, not from 0; in a batch warm-up's stage, scaled by the square
    root of the stage's micro-batches over the full batch's."""
    import math
    from types import SimpleNamespace

    from components.lib.recipe import learning_rate_schedule

    schedule = learning_rate_schedule(SimpleNamespace(**summary["arguments"]), summary["total_steps"])
    full = summary["arguments"]["gradient_accumulation_steps"]

    def micro_batches(step: int) -> int:
        return next(micro for start, micro in reversed(summary["batch_stages"]) if step >= start)

    return [
        float(schedule(point["step"])) * math.sqrt(micro_batches(point["step"]) / full) for point in summary["history"]
    ]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, embedded_shards: dict) -> Path:
    """A tiny model folder the train step wrote, trained long enough to predict something other than its
    initialisation (60 steps of the embedded corpus); tests read it and never change it."""

    def make(folder: Path) -> None:
        train_tiny(folder / "model", embedded_shards, learning_rate=1e-3, max_steps=60)

    return made_once(tmp_path_factory, "tiny-model", make) / "model"


@pytest.fixture(scope="session")
def wikitext_tokenizer(tmp_path_factory: pytest.TempPathFactory, wikitext: Path) -> str:
    from components.tokenizer import TokenizerArguments, train_tokenizer

    def make(folder: Path) -> None:
        corpus = str(wikitext / "valid.txt")
        train_tokenizer(
            TokenizerArguments(output=str(folder / "tokenizer"), corpus=corpus, vocab_size=WIKITEXT_VOCAB_SIZE)
        )

    return str(made_once(tmp_path_factory, "wikitext", make) / "tokenizer")


def run_at(action: list[str], *command: str) -> subprocess.CompletedProcess:
    """Runs the job ``command`` (``python -m`` style) under ``tests/kill_at.py``, acting (``--function ... --action
    ...``) at a chosen call, as ``run_module`` runs a job."""
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "tests" / "kill_at.py"), *action, "--", *command],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )


class HardExits:
    """Stands in for a module's ``hard_exit`` (the real one would end pytest): records each call, and ``ended``
    says one came."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.ended = threading.Event()

    def __call__(self, code: int, why: str) -> None:
        self.calls.append((code, why))
        self.ended.set()


def record_hard_exits(monkeypatch: pytest.MonkeyPatch, module: object) -> HardExits:
    hard_exits = HardExits()
    monkeypatch.setattr(module, "hard_exit", hard_exits)
    return hard_exits


def run_module(module: str, *args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Runs ``python -m module args`` as the containers do, from the project root, in this process's environment
    or ``env``."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env={**(env or os.environ), "PYTHONPATH": str(PROJECT_ROOT)},
        **kwargs,
    )


def compiled_step_command(spec: dict, step: str) -> list[str]:
    """The command and arguments a step of a compiled pipeline (``spec``, the YAML loaded) runs in its container:
    for the vertex target's train step, its TPU job's; its executor input is the placeholder to fill."""
    if "worker_pool_specs" in spec["components"][f"comp-{step}"]["inputDefinitions"]["parameters"]:
        parameters = spec["components"][f"comp-{step}"]["inputDefinitions"]["parameters"]
        container = parameters["worker_pool_specs"]["defaultValue"][0]["container_spec"]
    else:
        container = spec["deploymentSpec"]["executors"][f"exec-{step}"]["container"]
    return [*container["command"], *container["args"]]


def filled_step_command(command: list[str], tmp_path: Path, parameters: dict, artifacts: dict) -> list[str]:
    """A compiled step's ``command`` (``compiled_step_command``) with the executor input Vertex AI would fill in:
    ``parameters`` by name, ``artifacts`` by name as (KFP schema title, URI), inputs and outputs alike."""
    import json

    def artifact(name: str, schema: str, uri: str) -> dict:
        return {"artifacts": [{"name": name, "type": {"schemaTitle": schema}, "uri": uri, "metadata": {}}]}

    given = {name: artifact(name, *value) for name, value in artifacts.items()}
    executor_input = {
        "inputs": {"parameterValues": parameters, "artifacts": given},
        "outputs": {"artifacts": given, "outputFile": str(tmp_path / "executor_output.json")},
    }
    return [json.dumps(executor_input) if argument.startswith("{{$") else argument for argument in command]


def run_compiled_step(command: list[str], tmp_path: Path, parameters: dict, artifacts: dict, **kwargs):
    """Runs a compiled step's ``command`` as its container would, through KFP's executor, with the executor input
    ``filled_step_command`` makes; the image's ``python3`` is this environment's."""
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return subprocess.run(
        filled_step_command(command, tmp_path, parameters, artifacts),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path, "PYTHONPATH": str(PROJECT_ROOT)},
        **kwargs,
    )


@pytest.fixture(scope="session")
def wikitext_shards(tmp_path_factory: pytest.TempPathFactory, wikitext: Path, wikitext_tokenizer: str) -> dict:
    """Train shards from WikiText-2 valid.txt and validation shards from test.txt (first 600 texts)."""
    from components.shards import ShardArguments, write_shards

    def make(root: Path) -> None:
        # WikiText-2's first 600 test texts, or all of the smaller stand-in's
        validation_limit = 600 if wikitext_present() else 0
        for split, corpus, limit in (("train", "valid.txt", 0), ("validation", "test.txt", validation_limit)):
            write_shards(
                ShardArguments(
                    output=str(root / split),
                    tokenizer=wikitext_tokenizer,
                    corpus=str(wikitext / corpus),
                    split=split,
                    limit=limit,
                    records_per_shard=1000,
                )
            )

    root = made_once(tmp_path_factory, "wikitext-shards", make)
    return {"train": str(root / "train"), "validation": str(root / "validation"), "tokenizer": wikitext_tokenizer}


HUB_TOKEN = "hf_test_write_token_0123456789"


@pytest.fixture
def hub():
    """A local stand-in of the Hub's HTTP API with one write token; ``hub.env`` points a process at it."""
    from hub_server import HubStandIn

    with HubStandIn({HUB_TOKEN: "write", "hf_read_only": "read"}) as server:
        server.env = {
            **os.environ,
            "HF_ENDPOINT": server.url,
            "HF_HUB_DISABLE_XET": "1",
            "HF_TOKEN": HUB_TOKEN,
            "PYTHONPATH": str(PROJECT_ROOT),
        }
        yield server


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A Cloud Storage emulator with the bucket ``bucket``, and the routing that lets TensorFlow's own gs://
    filesystem reach it (see gcs_routing), in a process of their own; returns what a process needs to reach
    them (environment variables)."""
    import json

    folder = tmp_path_factory.mktemp("gcs-routing")
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("gcs_routing.py")), str(folder), "bucket"],
        stdout=subprocess.PIPE,
        text=True,
    )
    env = json.loads(server.stdout.readline())
    yield env
    server.kill()
    server.wait()


@pytest.fixture
def gcs(gcs_server, monkeypatch, request) -> str:
    """A ``gs://`` folder of this test's own in the emulator, with this process (TensorFlow included) and its
    subprocesses pointed at the emulator."""
    import uuid

    for key, value in gcs_server.items():
        monkeypatch.setenv(key, value)
    return f"gs://bucket/{request.node.name.split('[')[0]}-{uuid.uuid4().hex[:8]}"


def own_aiplatform_settings(monkeypatch) -> None:
    """aiplatform's settings for this test only: a fresh global config, and ``aiplatform.init`` (bound to the config
    of the import) setting that one, so that submit's init reaches the jobs it creates here and no later test."""
    from google.cloud import aiplatform
    from google.cloud.aiplatform import initializer

    config = initializer._Config()
    monkeypatch.setattr(initializer, "global_config", config)
    monkeypatch.setattr(aiplatform, "init", config.init)
