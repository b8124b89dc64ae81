"""A training's attempts (``attempts.json`` in its checkpoint folder), so that the restarts Vertex AI makes of a
failing job (up to 5 a worker, then 3 of the whole job) and the pipeline's retries do not each pay a TPU start,
a compile and the steps to the same failure again.

Each attempt is recorded when it starts and again when it ends: done, stopped by a SIGTERM (a preemption or a
stop: no failure, whenever it comes) or failed; one still "running" when the next starts died without a word
(a timeout, a crash of the runtime): the next starts only once it holds the checkpoint folder's lease, which a
live training keeps (``lease.py``). After ``REPEATS`` failed or silently dead attempts from the same checkpoint
with the same settings and runtime, the next is refused before the TPU is initialised. A start that hangs past its
deadline is a failure too (a hang that repeats is the runtime's: tensorflow/tensorflow#93618). A TPU that failed to
start with an error a new start may not meet (``AcceleratorStartFailed``) is recorded as "start failed" and not
counted: such starts are bounded by the run's time limit, which the pipeline's launcher keeps, not by ``REPEATS``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from components.lib import storage
from components.lib.devices import AcceleratorStartFailed
from components.lib.errors import InvalidParameter
from components.lib.preemption import STOPPED_EXIT, hard_exit

log = logging.getLogger("tpu_mlm.train")

FILE = "attempts.json"
# the pipeline run training, set in its environment by the launcher (the run's resource name) and by run-local (its
# run folder's name): each attempt names it, so that clean tells the runs that trained in a checkpoint folder apart
RUN_VARIABLE = "TPU_MLM_RUN"
REPEATS = 2
START_FAILED = "start failed"  # an attempt whose TPU did not start for a reason another start may not meet


class Attempts:
    def __init__(self, checkpoint_dir: str, settings: dict[str, Any], runtime_variables: tuple[str, ...]):
        self.uri = storage.join(checkpoint_dir, FILE)
        runtime = {name: os.environ.get(name, "") for name in runtime_variables}
        self.key = hashlib.sha256(json.dumps([settings, runtime], sort_keys=True, default=str).encode()).hexdigest()
        self.step = latest_checkpoint_step(checkpoint_dir)
        self.records = json.loads(storage.read_text(self.uri)) if storage.exists(self.uri) else []
        self._current: dict[str, Any] | None = None

    def refuse_a_repeat(self) -> None:
        last = [attempt for attempt in self.records if attempt["outcome"] != START_FAILED][-REPEATS:]
        failed = all(
            a["key"] == self.key and a["step"] == self.step and a["outcome"] in ("failed", "running") for a in last
        )
        if len(last) == REPEATS and failed:
            error = last[-1].get("error") or "it ended without a word (killed: a timeout, or the runtime crashed)"
            raise InvalidParameter(
                "checkpoint_dir",
                storage.dirname(self.uri),
                f"the last {REPEATS} attempts of this training, with these settings and runtime, failed from "
                f"step {self.step}: {error}; fix the cause (or delete {FILE} there to try again)",
            )

    @contextlib.contextmanager
    def recorded(self, begun: bool = True) -> Iterator[None]:
        """Records the attempt as running, then how it ended; with ``begun=False`` only a failure is written."""
        record = self._new_record()
        if begun:
            self.records.append(record)
            self._write()
            self._current = record
        try:
            yield
        except SystemExit as stop:
            self._end(record, "stopped" if stop.code == STOPPED_EXIT else "failed", f"exit {stop.code}")
            raise
        except Exception as error:
            outcome = START_FAILED if isinstance(error, AcceleratorStartFailed) else "failed"
            self._end(record, outcome, f"{type(error).__name__}: {error}"[:2000])
            raise
        finally:
            self._current = None
        if begun:
            self._end(record, "done", "")

    @contextlib.contextmanager
    def start_deadline(self, seconds: float) -> Iterator[None]:
        """A start (the TPU's initialisation) that has not ended within ``seconds`` is recorded as a failed attempt
        and ends the process, instead of hanging until the job's timeout."""

        def expired() -> None:
            minutes = f"{seconds / 60:g}"
            self._end(
                self._new_record(), "failed", f"the accelerator did not start within {minutes} min (--start_minutes)"
            )
            hard_exit(
                1,
                f"the accelerator did not start within {minutes} min: this attempt fails, and a second such start from "
                "this checkpoint refuses the next (a start that hangs again is the runtime's, as in "
                "tensorflow/tensorflow#93618: try the other TPU image)",
            )

        timer = threading.Timer(seconds, expired)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def stopped(self) -> None:
        """Records the running attempt as stopped by a SIGTERM, at once: the process may not live to say it."""
        if self._current is not None:
            self._end(self._current, "stopped", "SIGTERM")

    def _new_record(self) -> dict[str, Any]:
        """An attempt starting now, running until it ends."""
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        run = os.environ.get(RUN_VARIABLE, "")
        return {"key": self.key, "step": self.step, "started": started, "outcome": "running", "run": run}

    def _end(self, record: dict[str, Any], outcome: str, error: str) -> None:
        if record not in self.records:
            self.records.append(record)
        record.update(outcome=outcome, error=error)
        with contextlib.suppress(Exception):  # the failure itself matters more than its record
            self._write()

    def _write(self) -> None:
        storage.write_text_atomic(self.uri, json.dumps(self.records, indent=1) + "\n")


def runs_trained_in(checkpoint_dir: str) -> list[str]:
    """The pipeline runs whose attempts trained in ``checkpoint_dir``, as its attempts name them (``RUN_VARIABLE``),
    in the order they first did; attempts of a training outside a pipeline run name none."""
    uri = storage.join(checkpoint_dir, FILE)
    try:
        records = json.loads(storage.read_text(uri)) if storage.exists(uri) else []
    except ValueError:
        records = None
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        # who trained there cannot be told: refused rather than taken for no one
        raise InvalidParameter("checkpoint_dir", checkpoint_dir, f"its {FILE} is not a list of attempts' records")
    return list(dict.fromkeys(run for record in records if isinstance(run := record.get("run"), str) and run))


def latest_checkpoint_step(checkpoint_dir: str) -> int:
    """The step of the latest checkpoint, from the checkpoint manager's state file; 0 without one."""
    state = storage.join(checkpoint_dir, "checkpoint")
    if not storage.exists(state):
        return 0
    found = re.search(r'^model_checkpoint_path: ".*?(\d+)"', storage.read_text(state), re.M)
    return int(found.group(1)) if found else 0
