"""Shared fixtures: real corpora (WikiText-2 from ../shared/data, the embedded pydoc text) and tokenizers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import components  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any test imports TensorFlow)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
WIKITEXT = SHARED_DATA / "wikitext-2"


@pytest.fixture(scope="session")
def wikitext() -> Path:
    """WikiText-2 (valid.txt, test.txt); CI has it beside the checkout, a fresh clone does not."""
    if not (WIKITEXT / "valid.txt").exists():
        pytest.skip(f"needs the shared WikiText-2 corpus at {WIKITEXT} (present in CI, not in a fresh clone)")
    return WIKITEXT


@pytest.fixture(scope="session")
def embedded_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tokenizer trained on the embedded corpus, shared by the tests that only need some tokenizer."""
    from components.tokenizer import TokenizerArguments, train_tokenizer

    output = str(tmp_path_factory.mktemp("embedded") / "tokenizer")
    train_tokenizer(TokenizerArguments(output=output, corpus="embedded", vocab_size=3000))
    return output


@pytest.fixture(scope="session")
def wikitext_tokenizer(tmp_path_factory: pytest.TempPathFactory, wikitext: Path) -> str:
    from components.tokenizer import TokenizerArguments, train_tokenizer

    output = str(tmp_path_factory.mktemp("wikitext") / "tokenizer")
    train_tokenizer(TokenizerArguments(output=output, corpus=str(wikitext / "valid.txt"), vocab_size=5000))
    return output


def run_module(module: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """Runs ``python -m module args`` as the containers do, from the project root."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        **kwargs,
    )


@pytest.fixture(scope="session")
def wikitext_shards(tmp_path_factory: pytest.TempPathFactory, wikitext: Path, wikitext_tokenizer: str) -> dict:
    """Train shards from WikiText-2 valid.txt and validation shards from test.txt (first 600 texts)."""
    from components.shards import ShardArguments, write_shards

    root = tmp_path_factory.mktemp("wikitext-shards")
    for split, corpus, limit in (("train", "valid.txt", None), ("validation", "test.txt", 600)):
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


@pytest.fixture
def gcs(monkeypatch):
    """A Cloud Storage emulator on loopback with the bucket ``bucket``; google-cloud-storage clients find it
    through ``STORAGE_EMULATOR_HOST``."""
    import socket

    from gcp_storage_emulator.server import create_server

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="bucket")
    server.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    yield f"http://127.0.0.1:{port}"
    server.stop()
