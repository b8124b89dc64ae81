"""One training per checkpoint folder: the lease (``lease.json`` in the folder) that a training holds while it runs.

The train step takes the lease at its start, before the accelerator is initialised; a daemon thread renews it every
``expiry / HEARTBEATS_IN_EXPIRY`` seconds, and the step releases it however it ends (done, stopped by a SIGTERM,
failed, a hard exit). A lease its holder stopped renewing (the process killed, its VM gone) expires ``expiry``
seconds after its last heartbeat: ``live_lease`` no longer returns it, and the next start takes it over.

A start that finds another holder's live lease:

* a restart of the same Vertex AI job (the same ``CLOUD_ML_JOB_ID``: Vertex AI restarts a worker that exited, and a
  job has one train step, on host 0) takes it over at once: the worker that held it is gone;
* a holder on this machine (the same host name and boot) whose process is gone (killed: a ``run-local`` stopped, a
  test's SIGKILL) is taken over at once too;
* else it watches the lease until it expires: renewed meanwhile, its holder is alive and the start is refused in
  one line (``LeaseHeld``); never renewed, its holder is dead (a pipeline task's retry creates a new job minutes
  after its killed predecessor, which had no time to release it) and the start takes it over. Waiting up to the
  expiry costs that retry a few minutes; refusing at once would fail the retry that is meant to resume.

Writes are atomic (``storage.write_text_atomic``) but Cloud Storage offers this project's storage layer no
compare-and-swap: two starts that both find the lease free both write it, and the later write wins. Each reads
the lease back after a pause (``settle``) and only the one whose token is there goes on; the other is refused.
What remains: a start whose read and write are further apart than the other's write and read-back (a request
stalled for longer than ``settle``) can still go on beside it. Expiry compares the holder's clock with the
reader's: machines kept in time by NTP, as Google Cloud's are, are off by far less than a heartbeat."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter, Refused
from components.lib.preemption import hard_exit, last_words

log = logging.getLogger("tpu_mlm.train")

FILE = "lease.json"
EXPIRY_SECONDS = 300.0  # the train step's default (--lease_seconds): five missed heartbeats of a minute
HEARTBEATS_IN_EXPIRY = 5  # the holder renews the lease this many times within its expiry
READ_BACK_SECONDS = 1.0  # the pause before a taken lease is read back (at most half a heartbeat)
JOB_ID_VARIABLE = "CLOUD_ML_JOB_ID"  # set by Vertex AI in a custom job's containers


class LeaseHeld(Refused):
    """Another training holds the checkpoint folder's lease and renews it: a start there is refused (exit 3)."""


# what every lease this project writes holds, by type (a bool is no number here, though Python's is an int)
NUMBERS = ("heartbeat_at", "expires_at", "heartbeat_seconds")
FIELDS: dict[str, type] = {"holder": str, "heartbeat": str, "expires": str, "token": str, "job": str, "pid": int}
# what later versions added (absent from an earlier version's lease), checked when present
LATER_FIELDS: dict[str, type] = {"run": str, "machine": str, "host": str, "started": str}
MAX_PID = 2**31 - 1
ROUNDING_SECONDS = 1.0  # an honest expires_at and heartbeat_at + 5 heartbeats differ by a float's rounding at most


def _read(checkpoint_dir: str) -> dict[str, Any] | None:
    """The folder's lease record, None when it has none; a lease.json that is no lease this project wrote (forged,
    damaged, not JSON) is refused with ``InvalidParameter``: whether a training holds the folder cannot be told, and
    taking it over could put a second training in a folder one still trains in."""
    uri = storage.join(checkpoint_dir, FILE)
    if not storage.exists(uri):
        return None
    try:
        record = json.loads(storage.read_text(uri))
    except (ValueError, UnicodeDecodeError):
        # refused as a forged record is: leases are written atomically, so one that is not JSON was written by hand
        # or damaged, and ignoring it would let a start take a folder whose holder may still be training
        raise _not_a_lease(checkpoint_dir, "not JSON") from None
    wrong = _what_is_wrong(record)
    if wrong:
        raise _not_a_lease(checkpoint_dir, wrong)
    # a lease expires at most its expiry after its last heartbeat (the holder writes exactly that): a later
    # expires_at, which no holder writes, would keep a dead holder's lease live and a waiting start waiting for
    # ever. Bounded by the record's own expiry, not the reader's: an honest holder's may be longer than a reader's
    # (--lease_seconds), and waiting only the reader's would take a live holder's lease between two heartbeats.
    latest = record["heartbeat_at"] + record["heartbeat_seconds"] * HEARTBEATS_IN_EXPIRY
    if record["expires_at"] > latest + ROUNDING_SECONDS:
        log.warning("%s expires %s, beyond its expiry: taken to expire %s", uri, record["expires"], _utc(latest))
        record.update(expires_at=latest, expires=_utc(latest))
    return record


def _what_is_wrong(record: Any) -> str:
    """What makes ``record`` no lease this project writes ("" when it is one)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for name in (*FIELDS, *NUMBERS):
        if name not in record:
            return f"no {name}"
    for name, kind in [*FIELDS.items(), *((name, kind) for name, kind in LATER_FIELDS.items() if name in record)]:
        if not isinstance(record[name], kind) or isinstance(record[name], bool):
            return f"{name} is {type(record[name]).__name__}, not {kind.__name__}"
    for name in NUMBERS:
        value = record[name]
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            return f"{name} is {value!r}, not a finite number"
    if record["heartbeat_seconds"] <= 0:
        return f"heartbeat_seconds is {record['heartbeat_seconds']!r}, not above 0"
    if not 0 < record["pid"] <= MAX_PID:  # os.kill takes a C int; 0 and below name process groups
        return f"pid is {record['pid']}, not a process id"
    return ""


def _not_a_lease(checkpoint_dir: str, why: str) -> InvalidParameter:
    return InvalidParameter(
        "checkpoint_dir",
        checkpoint_dir,
        f"its {FILE} is not a lease this project wrote ({why}): delete it once no training runs there",
    )


def live_lease(checkpoint_dir: str) -> dict[str, Any] | None:
    """The live lease of ``checkpoint_dir``: its record (``holder``, ``run``, ``job``, ``host``, ``pid``, ``token``,
    ``started``, ``heartbeat``, ``expires`` as UTC times, ``expires_at`` in seconds since the epoch,
    ``heartbeat_seconds``); None when the folder has none or its holder is dead: its lease expired, or it was held on
    this machine by a process that is gone. A lease.json that is no lease this project wrote is refused (``_read``)."""
    record = _read(checkpoint_dir)
    return record if record is not None and _alive(record) else None


def _alive(record: dict[str, Any]) -> bool:
    """Whether a lease's holder may be alive: its lease not expired and, held on this machine, its process there."""
    if time.time() >= record["expires_at"]:
        return False
    return record.get("machine") != _machine() or _running(record["pid"])


def describe(record: dict[str, Any]) -> str:
    """A live lease in a few words: its holder and when it expires unless renewed."""
    left = max(0, round(record["expires_at"] - time.time()))
    return f"{record['holder']}, last heartbeat {record['heartbeat']}, expires {record['expires']} ({left} s from now)"


def _machine() -> str:
    """This machine as its processes share it: its host name (a container's own) and its boot's id."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    boot_id = boot.read_text().strip() if boot.exists() else ""
    return f"{socket.gethostname()}/{boot_id}"


def _running(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs (or may: another user's, this process itself)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _first_missing(folder: str) -> str:
    """The first folder of ``folder``'s path that does not exist (``folder`` itself in a bucket, where writing
    the lease makes only its marker), or "" when ``folder`` exists."""
    if storage.exists(folder):
        return ""
    if storage.is_remote(folder):
        return folder
    while not os.path.exists(os.path.dirname(os.path.abspath(folder))):
        folder = os.path.dirname(os.path.abspath(folder))
    return folder


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class Lease:
    """This process's lease on ``checkpoint_dir``, held for the length of ``held()``."""

    def __init__(self, checkpoint_dir: str, expiry: float = EXPIRY_SECONDS, run: str = ""):
        """``run``: the pipeline run training (its name finds it for ``tpu-mlm status`` and ``cancel``), if any."""
        if expiry <= 0:
            raise ValueError(f"a lease's expiry must be above 0, not {expiry}")
        self.checkpoint_dir = checkpoint_dir
        self.uri = storage.join(checkpoint_dir, FILE)
        self.expiry = expiry
        self.heartbeat_seconds = expiry / HEARTBEATS_IN_EXPIRY
        self.settle = min(READ_BACK_SECONDS, self.heartbeat_seconds / 2)
        self.job = os.environ.get(JOB_ID_VARIABLE, "")
        self.host = socket.gethostname()
        self.machine = _machine()
        self.pid = os.getpid()
        self.token = uuid.uuid4().hex
        self.run = run
        where = f"host {self.host} (pid {self.pid})"
        holder = f"Vertex AI job {self.job} on {where}" if self.job else where
        self.holder = f"pipeline run {run}: {holder}" if run else holder
        self.started = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._made = ""  # the first folder of the checkpoint folder's path that taking the lease made

    @contextlib.contextmanager
    def held(self) -> Iterator[Lease]:
        """Takes the lease (``LeaseHeld`` where another training holds it), renews it while in the block, and
        releases it at the block's end, however it ends; a hard exit (``preemption.hard_exit``) releases it too."""
        self.take()
        self._thread = threading.Thread(target=self._renew_until_released, name="lease", daemon=True)
        self._thread.start()
        try:
            with last_words(lambda why: self.release()):
                yield self
        finally:
            self.release()

    def take(self) -> None:
        """Takes the lease: free, expired, the same Vertex AI job's, or another's that expires without a renewal
        while this start watches it; else refuses with ``LeaseHeld``."""
        found = _read(self.checkpoint_dir)
        if found is not None and _alive(found) and not self._same_job(found):
            self._wait_for_expiry(found)
        self._made = _first_missing(self.checkpoint_dir)
        self._write()
        time.sleep(self.settle)  # another start that wrote meanwhile wins; read back which
        after = _read(self.checkpoint_dir)
        if after is None or after.get("token") != self.token:
            raise LeaseHeld(self._refusal(after, "took it at the same time"))
        log.info("lease on %s taken: %s", self.checkpoint_dir, self.holder)

    def release(self) -> None:
        """Stops the heartbeat and deletes the lease if it is still this process's, and the folders taking it made
        if nothing else was written in them (a start refused for its input leaves nothing); never raises."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.heartbeat_seconds)
        with contextlib.suppress(Exception):  # the step's own outcome matters more than the lease's
            record = _read(self.checkpoint_dir)
            if record is None or record.get("token") != self.token:
                return
            storage.remove(self.uri)
            log.info("lease on %s released", self.checkpoint_dir)
            if self._made and not storage.files_under(self._made):
                storage.remove_folder(self._made)

    def _same_job(self, found: dict[str, Any]) -> bool:
        """Whether a live lease is this Vertex AI job's, held by a worker Vertex AI restarted: taken over at once."""
        if self.job and found.get("job") == self.job:
            log.warning("lease on %s held by an earlier start of this job (%s): taken over", self.uri, found["holder"])
            return True
        return False

    def _wait_for_expiry(self, found: dict[str, Any]) -> None:
        """Watches another holder's live lease: returns once it expired or was released without a renewal, raises
        ``LeaseHeld`` the moment it is renewed or taken by another."""
        log.warning(
            "checkpoint folder %s is leased to %s: waiting up to its expiry for it to be renewed (refused) or not "
            "(its training is dead: taken over)",
            self.checkpoint_dir,
            describe(found),
        )
        poll = max(0.05, min(found.get("heartbeat_seconds", self.heartbeat_seconds), self.heartbeat_seconds) / 2)
        while True:
            now = time.time()
            if now >= found["expires_at"]:
                log.warning("lease of %s expired without a heartbeat: taken over", found["holder"])
                return
            time.sleep(min(poll, found["expires_at"] - now))
            current = _read(self.checkpoint_dir)
            if current is None or not _alive(current):
                log.info("lease of %s released, or its process gone: taken", found["holder"])
                return
            if (current.get("token"), current["heartbeat_at"]) != (found.get("token"), found["heartbeat_at"]):
                raise LeaseHeld(self._refusal(current, "renews it"))

    def _refusal(self, record: dict[str, Any] | None, what: str) -> str:
        holder = describe(record) if record is not None else "another start that released it since"
        return (
            f"another training holds the lease on checkpoint folder {self.checkpoint_dir} and {what} ({holder}): two "
            "trainings in one folder would write over each other's checkpoints; let it end, or stop it (tpu-mlm "
            "status / tpu-mlm cancel RUN), then start again"
        )

    def _write(self) -> None:
        now = time.time()
        record = {
            "holder": self.holder,
            "run": self.run,
            "job": self.job,
            "host": self.host,
            "machine": self.machine,
            "pid": self.pid,
            "token": self.token,
            "started": _utc(self.started),
            "heartbeat": _utc(now),
            "heartbeat_at": now,
            "expires": _utc(now + self.expiry),
            "expires_at": now + self.expiry,
            "heartbeat_seconds": self.heartbeat_seconds,
        }
        storage.write_text_atomic(self.uri, json.dumps(record, indent=1) + "\n")

    def _renew_until_released(self) -> None:
        """The heartbeat: renews the lease until released. A failed renewal is tried again at the next beat; a lease
        found taken by another start (this one missed its expiry) ends the process at once, before it writes over
        the other's checkpoints."""
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                record = _read(self.checkpoint_dir)
                if self._stop.is_set():
                    return
                if record is not None and record.get("token") != self.token:
                    hard_exit(
                        1,
                        f"the lease on {self.checkpoint_dir} was taken over by {record['holder']} after this "
                        f"training missed its heartbeats for {self.expiry:g} s: stopping without a checkpoint",
                    )
                    return
                self._write()
            except Exception as error:  # a storage hiccup: the next beat tries again, within the expiry
                log.warning("could not renew the lease on %s: %s", self.checkpoint_dir, error)
