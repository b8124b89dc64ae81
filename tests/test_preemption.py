"""``preemption``: a SIGTERM heard in and out of the training loop, the pace of calls into the graph, the hard exit."""

import signal
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from conftest import PROJECT_ROOT, record_hard_exits

from components.lib import preemption
from components.lib.preemption import STOPPED_EXIT, CallPace, StopRequest


def test_calls_into_the_graph_stay_within_seconds_from_the_second_on(monkeypatch):
    clock = iter([0.0, 60.0, 100.0, 105.0])  # a first call of 50 steps that compiled for a minute, then 2 steps in 5 s
    # the module's clock only: time.perf_counter itself is every thread's of this test process
    monkeypatch.setattr(preemption, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    pace = CallPace()
    assert pace.steps_per_call() > 50  # the first call: steps_per_execution and the log boundaries decide
    pace.start(), pace.done(50)
    assert pace.first_call_seconds == 60.0
    assert pace.steps_per_call() == 8  # 10 s at the first call's 1.2 s a step, its compile included: fewer, never more
    pace.start(), pace.done(2)
    assert pace.steps_per_call() == 4  # then the last call's 2.5 s a step


def test_a_step_slower_than_a_call_s_seconds_still_runs_one_step_a_call(monkeypatch):
    clock = iter([0.0, 3 * CallPace.CALL_SECONDS])
    monkeypatch.setattr(preemption, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    pace = CallPace()
    pace.start(), pace.done(1)
    assert pace.steps_per_call() == 1


def test_in_the_loop_a_sigterm_asks_for_a_checkpoint_and_its_callbacks_run_at_once():
    before = signal.getsignal(signal.SIGTERM)
    heard = threading.Event()
    with StopRequest() as stop:
        stop.in_loop = True
        stop.on_stop.append(heard.set)  # the attempt recorded as stopped, from the listening thread
        signal.raise_signal(signal.SIGTERM)  # no exit: the loop checkpoints after the steps running, then exits
        assert heard.wait(10) and stop.requested
    assert signal.getsignal(signal.SIGTERM) == before


def test_outside_the_loop_a_sigterm_exits_as_stopped_and_the_process_ends_after_the_grace(monkeypatch):
    """The main thread unwinds with ``STOPPED_EXIT``; should it be held in a native call instead, the listening
    thread ends the process once the grace is over."""
    hard_exits = record_hard_exits(monkeypatch, preemption)
    stopped = []
    with StopRequest() as stop:
        stop.EXIT_GRACE = 0.1
        stop.on_stop.append(lambda: stopped.append(True))
        with pytest.raises(SystemExit) as exit_:
            signal.raise_signal(signal.SIGTERM)
        assert exit_.value.code == STOPPED_EXIT
        assert hard_exits.ended.wait(10)  # before the real hard_exit is put back
    assert stopped == [True] and stop.requested
    ((code, why),) = hard_exits.calls
    assert code == STOPPED_EXIT and why.startswith("SIGTERM: the step did not stop within 0 s")


def test_outside_the_main_thread_a_stop_request_installs_no_handler():
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def enter() -> None:
        with StopRequest():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == [before]  # Python delivers signals to the main thread only: a handler there would never run


HELD_MAIN_THREAD = """
import threading, time
from components.lib.preemption import hard_exit, last_words

def unwritable(why):
    raise RuntimeError("a report that cannot be written")

with last_words(lambda why: print("a block that ended:", why, flush=True)):
    pass
with last_words(unwritable), last_words(lambda why: print("last words:", why, flush=True)):
    try:
        threading.Thread(target=hard_exit, args=(7, "the TPU did not start")).start()
        time.sleep(60)  # the main thread held
    finally:
        print("finally", flush=True)
"""


def test_a_hard_exit_from_another_thread_ends_the_process_after_the_last_words_of_the_blocks_it_is_in():
    ended = subprocess.run(
        [sys.executable, "-c", HELD_MAIN_THREAD], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=30
    )
    assert ended.returncode == 7, ended.stderr
    # a failing callback does not keep the next from running; no finally runs, and no block that ended speaks
    assert ended.stdout == "last words: the TPU did not start\n"
    assert "the TPU did not start" in ended.stderr  # logged
