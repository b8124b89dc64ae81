"""What a preemption gives a training: a SIGTERM, then about 30 s before the VM goes (Vertex AI sends the same
before it stops a job). ``StopRequest`` hears it from the step's start; ``CallPace`` keeps each call into the
graph short enough that the loop can checkpoint within the notice."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

log = logging.getLogger("tpu_mlm.train")

STOPPED_EXIT = 128 + signal.SIGTERM  # how a step that heard a SIGTERM exits
_LAST_WORDS: list[Callable[[str], None]] = []


@contextlib.contextmanager
def last_words(callback: Callable[[str], None]) -> Iterator[None]:
    """While in the block, ``callback(why)`` runs before a ``hard_exit``, which skips every ``finally``: where a
    report must still be written (the smoke test's)."""
    _LAST_WORDS.append(callback)
    try:
        yield
    finally:
        _LAST_WORDS.remove(callback)


def hard_exit(code: int, why: str) -> NoReturn:
    """Ends the process now, from any thread (its main thread is stuck in a native call), after the last words."""
    log.error(why)
    for callback in list(_LAST_WORDS):
        with contextlib.suppress(Exception):  # the exit matters more than any report of it
            callback(why)
    logging.shutdown()
    os._exit(code)


class StopRequest:
    """Hears a SIGTERM from the moment the step starts. Inside the training loop, ``requested`` tells the loop to
    checkpoint after the steps running and exit. Outside it there is nothing to save: the step exits with
    ``STOPPED_EXIT``, unwinding as any exit does (reports written, the attempt recorded as stopped).

    Python runs signal handlers only when the main thread gets a turn, which a long native call (the TPU's
    initialisation, a compile) does not give it before the VM goes. So the signal's C handler also writes to a
    pipe that a thread of its own reads: it runs the ``on_stop`` callbacks at once (the attempt is recorded as
    stopped, not left "running" to count as a failure) and, outside the loop, ends the process after
    ``EXIT_GRACE`` seconds if the main thread has not.

    In the main thread only (where Python delivers signals); elsewhere it never fires. Without a handler, a
    SIGTERM is ignored by the container's PID 1, which the step's Python is on Vertex AI."""

    EXIT_GRACE = 15.0  # of the ~30 s notice: a main thread that unwinds (an upload, say) has this long

    def __init__(self) -> None:
        self.requested = False
        self.in_loop = False
        self.on_stop: list[Callable[[], None]] = []
        self._restore: Callable[[], None] | None = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self
        read, write = os.pipe()
        os.set_blocking(write, False)
        previous_handler = signal.signal(signal.SIGTERM, self._in_main_thread)
        previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._listen, args=(read,), name="sigterm", daemon=True).start()

        def restore() -> None:
            signal.set_wakeup_fd(previous_fd)
            signal.signal(signal.SIGTERM, previous_handler)
            os.close(write)  # the listening thread reads the end of the pipe and stops

        self._restore = restore
        return self

    def __exit__(self, *exc: object) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None

    def _in_main_thread(self, signum: int, frame: Any) -> None:
        self.requested = True
        if not self.in_loop:
            log.warning("SIGTERM outside the training loop: nothing to checkpoint; exiting")
            raise SystemExit(STOPPED_EXIT)

    def _listen(self, read: int) -> None:
        with os.fdopen(read, "rb", buffering=0) as pipe:
            while data := pipe.read(64):
                if signal.SIGTERM in data:
                    self._heard()

    def _heard(self) -> None:
        self.requested = True
        for callback in self.on_stop:
            callback()
        if self.in_loop:
            return
        time.sleep(self.EXIT_GRACE)  # a daemon thread: if the main thread exits meanwhile, this ends with it
        hard_exit(
            STOPPED_EXIT,
            f"SIGTERM: the step did not stop within {self.EXIT_GRACE:.0f} s (a long native call: the TPU starting, "
            "a compile); exiting",
        )


class CallPace:
    """How many steps the next call into the graph may run: at most ``steps_per_execution``, and no more than
    fit in ``CALL_SECONDS`` at the pace of the last call. The first call's pace counts its compile too, so the
    second call is the shorter for it, never longer. A SIGTERM is acted on only between calls, and Vertex AI gives
    about 30 s after it."""

    CALL_SECONDS = 10.0

    def __init__(self) -> None:
        self.seconds_per_step: float | None = None
        self.first_call_seconds: float | None = None  # tracing and compiling the step, and its first steps
        self._started = 0.0

    def steps_per_call(self) -> int:
        if self.seconds_per_step is None:
            return sys.maxsize
        return max(1, int(self.CALL_SECONDS / self.seconds_per_step))

    def start(self) -> None:
        self._started = time.perf_counter()

    def done(self, steps: int) -> None:
        seconds = time.perf_counter() - self._started
        if self.first_call_seconds is None:  # the first call traces and compiles
            self.first_call_seconds = seconds
        self.seconds_per_step = seconds / steps
