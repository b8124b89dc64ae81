"""``lease``: one training per checkpoint folder. A train step's start is refused while another training renews the
folder's lease, takes over a dead training's once it expires (or at once, a restart of the same Vertex AI job), and
releases its own however it ends."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import PROJECT_ROOT, record_hard_exits, train_tiny

from components.lib import lease as lease_module
from components.lib.attempts import FILE as ATTEMPTS_FILE
from components.lib.errors import InvalidParameter
from components.lib.lease import FILE, JOB_ID_VARIABLE, Lease, LeaseHeld, live_lease
from components.lib.preemption import STOPPED_EXIT

# a holder that renews its lease within these seconds is alive: long enough for any machine's thread to get a turn,
# and a refusal comes at its first renewal (a fifth of it)
ALIVE_EXPIRY = 20.0


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
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


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
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


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
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


class Clock:
    """The lease's clock, moved by the test and by the lease's own sleeps: no outcome depends on the machine's speed."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str):  # the rest of the time module (formatting) as it is
        return getattr(time, name)


def test_a_lease_is_live_until_its_expiry_and_gone_after(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(lease_module, "time", clock)
    assert live_lease(str(tmp_path)) is None
    held = Lease(str(tmp_path), expiry=300)
    held.take()
    record = live_lease(str(tmp_path))
    assert record["token"] == held.token and record["holder"] == held.holder
    assert {"heartbeat", "expires", "expires_at", "started", "job", "host", "pid"} <= set(record)
    clock.sleep(record["expires_at"] - clock.now - 0.01)
    assert live_lease(str(tmp_path))["token"] == held.token  # live until its expiry
    clock.sleep(0.01)
    assert live_lease(str(tmp_path)) is None  # expired: a dead training's, anyone's to take
    assert (tmp_path / FILE).exists()


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
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
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
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


def honest_record(folder) -> dict:
    """The lease.json a training of another machine wrote in ``folder`` (alive: its expiry 600 s away)."""
    Lease(str(folder), expiry=600, run="elsewhere").take()
    record = json.loads((folder / FILE).read_text())
    return {**record, "machine": "another-host/another-boot"}


def without(record: dict, name: str) -> dict:
    return {key: value for key, value in record.items() if key != name}


def with_(record: dict, **changed) -> dict:
    return {**record, **changed}


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda record: without(record, "holder"), "no holder"),
        (lambda record: without(record, "heartbeat"), "no heartbeat"),
        (lambda record: without(record, "heartbeat_at"), "no heartbeat_at"),
        (
            lambda record: with_(record, expires_at="3000-01-01T00:00:00Z"),
            "expires_at is '3000-01-01T00:00:00Z', not a finite number",
        ),
        (lambda record: with_(record, pid="1234"), "pid is str, not int"),
        (lambda record: with_(record, pid=2**70), f"pid is {2**70}, not a process id"),
        (lambda record: with_(record, heartbeat_seconds=float("inf")), "heartbeat_seconds is inf, not a finite number"),
        (lambda record: "[1, 2]", "a JSON list, not an object"),
        (lambda record: '{"holder": "someone", ', "not JSON"),
    ],
    ids=[
        "no holder",
        "no heartbeat",
        "no heartbeat_at",
        "expires_at a string",
        "pid a string",
        "pid too large",
        "infinite heartbeat",
        "a list",
        "not JSON",
    ],
)
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_lease_json_this_project_did_not_write_refuses_the_folder_in_one_line(tmp_path, damage, why):
    """A forged or damaged lease.json: whether a training holds the folder cannot be told, so reading it (clean's and
    submit's live_lease, a train step's start) refuses the folder in one line, and the start leaves it as it is."""
    record = honest_record(tmp_path)
    damaged = damage(record)
    text = damaged if isinstance(damaged, str) else json.dumps(damaged)
    (tmp_path / FILE).write_text(text)
    expected = (
        f"--checkpoint-dir={str(tmp_path)!r}: its lease.json is not a lease this project wrote ({why}): delete it "
        "once no training runs there"
    )
    with pytest.raises(InvalidParameter) as read:
        live_lease(str(tmp_path))
    assert str(read.value) == expected
    with pytest.raises(InvalidParameter) as started:
        Lease(str(tmp_path), ALIVE_EXPIRY).take()
    assert str(started.value) == expected
    assert (tmp_path / FILE).read_text() == text  # not taken over


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_lease_expiring_beyond_its_own_expiry_expires_at_its_last_heartbeat_plus_that_expiry(tmp_path):
    """A lease.json whose expires_at is in the year 3000 (its heartbeat 0.3 s apart: an expiry of 1.5 s) is live
    1.5 s after its heartbeat at most: a start waits that long, not for ever. An honest lease keeps its expiry, a
    longer one than the reader's included."""
    honest = honest_record(tmp_path)
    assert live_lease(str(tmp_path))["expires_at"] == honest["expires_at"]  # 600 s: the reader's would be 20
    heartbeat_at = time.time()
    forged = {**honest, "heartbeat_at": heartbeat_at, "heartbeat_seconds": 0.3, "expires_at": 32503680000.0}
    (tmp_path / FILE).write_text(json.dumps(forged))
    record = live_lease(str(tmp_path))
    assert record is None or record["expires_at"] == pytest.approx(heartbeat_at + 1.5)
    started = time.monotonic()
    taking = threading.Thread(target=Lease(str(tmp_path), ALIVE_EXPIRY).take, daemon=True)
    taking.start()
    taking.join(timeout=60)  # a wait for the year 3000 would still be going
    assert not taking.is_alive() and time.monotonic() - started < 60
    assert live_lease(str(tmp_path))["token"] != forged["token"]  # taken over
