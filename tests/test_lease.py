"""``lease``: one training per checkpoint folder. A train step's start is refused while another training renews the
folder's lease, takes over a dead training's once it expires (or at once, a restart of the same Vertex AI job), and
releases its own however it ends."""

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import PROJECT_ROOT, record_hard_exits, train_tiny

from components.lib import lease as lease_module
from components.lib.attempts import FILE as ATTEMPTS_FILE
from components.lib.lease import FILE, JOB_ID_VARIABLE, Lease, LeaseHeld, live_lease
from components.lib.preemption import STOPPED_EXIT

# a holder that renews its lease within these seconds is alive: long enough for any machine's thread to get a turn,
# and a refusal comes at its first renewal (a fifth of it)
ALIVE_EXPIRY = 20.0


def test_a_start_is_refused_while_another_training_renews_the_folder_s_lease(tmp_path, embedded_shards):
    folder = tmp_path / "checkpoints"
    with Lease(str(folder), ALIVE_EXPIRY, run="first-run").held():
        held = live_lease(str(folder))
        assert held is not None and held["run"] == "first-run" and held["holder"].startswith("pipeline run first-run")
        with pytest.raises(LeaseHeld) as refused:
            train_tiny(tmp_path / "model", embedded_shards, checkpoint_dir=str(folder), lease_seconds=ALIVE_EXPIRY)
        message = str(refused.value)
        assert len(message.splitlines()) == 1
        assert f"holds the lease on checkpoint folder {folder} and renews it (pipeline run first-run" in message
        assert "tpu-mlm status / tpu-mlm cancel RUN" in message
        assert not (folder / ATTEMPTS_FILE).exists()  # refused before the attempt or the accelerator
        assert live_lease(str(folder))["token"] == held["token"]  # the holder's, still
    assert live_lease(str(folder)) is None and not (folder / FILE).exists()  # released


def test_a_dead_training_s_lease_expires_and_the_next_start_takes_it_over_then_releases_it(tmp_path, embedded_shards):
    folder = tmp_path / "checkpoints"
    Lease(str(folder), expiry=0.5, run="killed").take()  # taken, never renewed: its process was killed
    assert live_lease(str(folder))["run"] == "killed"
    summary = train_tiny(
        tmp_path / "model", embedded_shards, checkpoint_dir=str(folder), lease_seconds=0.5, max_steps=2
    )
    assert summary["total_steps"] == 2
    assert not (folder / FILE).exists()  # released once done
    (attempt,) = json.loads((folder / ATTEMPTS_FILE).read_text())
    assert attempt["outcome"] == "done"


def test_a_lease_held_by_a_process_gone_from_this_machine_is_no_longer_live_and_taken_over_at_once(tmp_path):
    taken = f"from components.lib.lease import Lease; Lease({str(tmp_path)!r}, expiry=600).take()"
    # the process takes the lease and ends without releasing it, as a killed one does
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    subprocess.run([sys.executable, "-c", taken], cwd=PROJECT_ROOT, env=env, check=True, timeout=120)
    record = json.loads((tmp_path / FILE).read_text())
    assert record["expires_at"] > time.time() + 60  # not expired, but its holder is gone
    assert live_lease(str(tmp_path)) is None
    started = time.monotonic()
    Lease(str(tmp_path), expiry=600).take()
    assert time.monotonic() - started < 300  # not the expiry's wait


def test_a_lease_is_live_until_its_expiry_and_gone_after(tmp_path):
    assert live_lease(str(tmp_path)) is None
    held = Lease(str(tmp_path), expiry=0.3)
    held.take()
    record = live_lease(str(tmp_path))
    assert record["token"] == held.token and record["holder"] == held.holder
    assert {"heartbeat", "expires", "expires_at", "started", "job", "host", "pid"} <= set(record)
    time.sleep(max(0.0, record["expires_at"] - time.time()) + 0.05)
    assert live_lease(str(tmp_path)) is None  # expired: a dead training's, anyone's to take
    assert (tmp_path / FILE).exists()


def test_a_restart_of_the_same_vertex_job_takes_its_own_lease_over_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(JOB_ID_VARIABLE, "1234")
    Lease(str(tmp_path), expiry=600).take()  # the worker Vertex AI restarts was killed holding it
    restarted = Lease(str(tmp_path), ALIVE_EXPIRY)
    started = time.monotonic()
    with restarted.held():
        assert time.monotonic() - started < 300  # not the expiry's wait
        assert live_lease(str(tmp_path))["token"] == restarted.token
        monkeypatch.setenv(JOB_ID_VARIABLE, "5678")  # another job: not its to take while renewed
        with pytest.raises(LeaseHeld, match=r"renews it \(Vertex AI job 1234 on host"):
            Lease(str(tmp_path), ALIVE_EXPIRY).take()


@pytest.mark.parametrize(
    "ending", [SystemExit(STOPPED_EXIT), SystemExit(1), ValueError("shard 3 is corrupted")], ids=str
)
def test_the_lease_is_released_however_the_training_ends(tmp_path, ending):
    with pytest.raises(type(ending)), Lease(str(tmp_path), ALIVE_EXPIRY).held():
        assert (tmp_path / FILE).exists()
        raise ending
    assert not (tmp_path / FILE).exists()


def test_a_refused_start_in_a_new_folder_leaves_nothing_behind(tmp_path):
    folder = tmp_path / "output" / "checkpoints"
    with pytest.raises(ValueError), Lease(str(folder), ALIVE_EXPIRY).held():
        raise ValueError("bad input")
    assert not (tmp_path / "output").exists()


def test_a_holder_whose_lease_was_taken_over_ends_at_once_without_writing_over_it(tmp_path, monkeypatch):
    hard_exits = record_hard_exits(monkeypatch, lease_module)
    holder = Lease(str(tmp_path), expiry=0.5)
    with holder.held():
        other = Lease(str(tmp_path), expiry=600, run="other")
        deadline = time.monotonic() + 60
        # what a start writes once it found the holder's lease expired (the holder stalled); written again should the
        # holder's renewal, under way, land after it
        while not hard_exits.ended.wait(0.2) and time.monotonic() < deadline:
            other._write()
        assert hard_exits.ended.is_set()
    ((code, why),) = hard_exits.calls
    assert code == 1 and "was taken over by pipeline run other" in why and "without a checkpoint" in why
    assert live_lease(str(tmp_path))["token"] == other.token  # neither renewed nor released by the old holder
