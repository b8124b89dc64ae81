"""``attempts``: each attempt of a training recorded as it starts and ends, and the repeat of a failure refused."""

import json
import threading
from types import SimpleNamespace

import pytest
from conftest import record_hard_exits

from components.lib import attempts as attempts_module
from components.lib.attempts import FILE, REPEATS, START_FAILED, Attempts, latest_checkpoint_step
from components.lib.devices import AcceleratorStartFailed
from components.lib.errors import InvalidParameter
from components.lib.preemption import STOPPED_EXIT

SETTINGS = {"model_config": "tiny", "learning_rate": 1e-3}
RUNTIME_VARIABLE = "TPU_MLM_TEST_RUNTIME"  # stands in for the TPU image's variables


def attempts(folder, settings: dict = SETTINGS) -> Attempts:
    """The record as a new attempt (a restarted job, a retried task) reads it from the checkpoint folder."""
    return Attempts(str(folder), settings, (RUNTIME_VARIABLE,))


def written(folder) -> list[dict]:
    return json.loads((folder / FILE).read_text())


def fail(folder, settings: dict = SETTINGS) -> None:
    with pytest.raises(ValueError), attempts(folder, settings).recorded():
        raise ValueError("shard 3 is corrupted")


def checkpoint_at(folder, step: int) -> None:
    """The checkpoint manager's state file as TensorFlow writes it, an earlier checkpoint kept beside the latest."""
    (folder / "checkpoint").write_text(
        f'model_checkpoint_path: "ckpt-{step}"\n'
        f'all_model_checkpoint_paths: "ckpt-{step // 2}"\nall_model_checkpoint_paths: "ckpt-{step}"\n'
    )


def test_an_attempt_is_written_running_as_it_starts_and_done_when_it_ends(tmp_path):
    with attempts(tmp_path).recorded():
        # written before the work: an attempt killed without a word stays "running"
        assert [attempt["outcome"] for attempt in written(tmp_path)] == ["running"]
    (attempt,) = written(tmp_path)
    assert (attempt["step"], attempt["outcome"], attempt["error"]) == (0, "done", "")


@pytest.mark.parametrize(
    ("ending", "outcome", "error"),
    [
        (ValueError("shard 3 is corrupted"), "failed", "ValueError: shard 3 is corrupted"),
        (SystemExit(STOPPED_EXIT), "stopped", f"exit {STOPPED_EXIT}"),  # a SIGTERM: a preemption is no failure
        (SystemExit(2), "failed", "exit 2"),
    ],
)
def test_how_an_attempt_ended_is_recorded_and_the_error_goes_on(tmp_path, ending, outcome, error):
    with pytest.raises(type(ending)), attempts(tmp_path).recorded():
        raise ending
    assert [(attempt["outcome"], attempt["error"]) for attempt in written(tmp_path)] == [(outcome, error)]


def test_a_sigterm_records_the_running_attempt_as_stopped_at_once(tmp_path):
    record = attempts(tmp_path)
    record.stopped()  # no attempt running: nothing to record
    assert not (tmp_path / FILE).exists()
    with pytest.raises(SystemExit), record.recorded():
        record.stopped()  # from the listening thread, while the main thread may never get to unwind
        assert [(attempt["outcome"], attempt["error"]) for attempt in written(tmp_path)] == [("stopped", "SIGTERM")]
        raise SystemExit(STOPPED_EXIT)
    assert [attempt["outcome"] for attempt in written(tmp_path)] == ["stopped"]


def test_checks_before_the_attempt_begins_record_only_a_failure(tmp_path):
    with attempts(tmp_path).recorded(begun=False):
        pass
    assert not (tmp_path / FILE).exists()
    with pytest.raises(ValueError), attempts(tmp_path).recorded(begun=False):
        raise ValueError("refused input")
    assert [attempt["outcome"] for attempt in written(tmp_path)] == ["failed"]


def test_the_repeat_of_failures_from_the_same_checkpoint_with_the_same_settings_and_runtime_is_refused(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(RUNTIME_VARIABLE, "tensorflow-tpu 2.20")
    for _ in range(REPEATS):
        attempts(tmp_path).refuse_a_repeat()
        fail(tmp_path)
    with pytest.raises(InvalidParameter) as refused:
        attempts(tmp_path).refuse_a_repeat()
    assert refused.value.parameter == "checkpoint_dir" and refused.value.value == str(tmp_path)
    assert refused.value.expected == (
        f"the last {REPEATS} attempts of this training, with these settings and runtime, failed from step 0: "
        f"ValueError: shard 3 is corrupted; fix the cause (or delete {FILE} there to try again)"
    )
    attempts(tmp_path, {**SETTINGS, "learning_rate": 5e-4}).refuse_a_repeat()  # other settings: another attempt
    monkeypatch.setenv(RUNTIME_VARIABLE, "tensorflow-tpu 2.19")
    attempts(tmp_path).refuse_a_repeat()  # another runtime: another attempt
    monkeypatch.setenv(RUNTIME_VARIABLE, "tensorflow-tpu 2.20")
    checkpoint_at(tmp_path, 20)
    later = attempts(tmp_path)
    later.refuse_a_repeat()  # training got further since: another attempt
    with later.recorded():
        pass
    assert written(tmp_path)[-1]["step"] == 20


def test_attempts_that_died_without_a_word_count_as_failures_and_a_stop_between_them_does_not(tmp_path):
    for _ in range(REPEATS):
        killed = attempts(tmp_path).recorded()
        killed.__enter__()  # and never left: the process was killed inside, its end never recorded
    with pytest.raises(InvalidParameter, match="failed from step 0: it ended without a word"):
        attempts(tmp_path).refuse_a_repeat()
    with pytest.raises(SystemExit), attempts(tmp_path).recorded():
        raise SystemExit(STOPPED_EXIT)
    fail(tmp_path)
    attempts(tmp_path).refuse_a_repeat()  # of the last two, one was preempted


def test_starts_that_failed_for_a_reason_a_new_start_may_not_meet_are_recorded_and_never_counted(tmp_path):
    """Any number of them, before, between or after real failures: the attempts record neither refuses for them nor
    forgets the failures around them (the run's time limit bounds them, in the pipeline's launcher)."""

    def start_failed() -> None:
        with pytest.raises(AcceleratorStartFailed), attempts(tmp_path).recorded(begun=False):
            raise AcceleratorStartFailed("the TPU at --tpu='local' did not start (UnavailableError: Socket closed)")

    for _ in range(REPEATS + 3):
        attempts(tmp_path).refuse_a_repeat()
        start_failed()
    assert [attempt["outcome"] for attempt in written(tmp_path)] == [START_FAILED] * (REPEATS + 3)
    assert "UnavailableError: Socket closed" in written(tmp_path)[0]["error"]
    fail(tmp_path)
    start_failed()
    attempts(tmp_path).refuse_a_repeat()  # one failure, whatever came between
    fail(tmp_path)
    start_failed()
    with pytest.raises(InvalidParameter, match="ValueError: shard 3 is corrupted"):
        attempts(tmp_path).refuse_a_repeat()


def test_the_step_is_the_latest_checkpoint_s_and_zero_without_one(tmp_path):
    assert latest_checkpoint_step(str(tmp_path)) == 0
    checkpoint_at(tmp_path, 40)
    assert latest_checkpoint_step(str(tmp_path)) == 40


def test_a_start_past_its_deadline_is_recorded_failed_and_ends_the_process(tmp_path, monkeypatch):
    hard_exits = record_hard_exits(monkeypatch, attempts_module)
    seconds = 0.06
    with attempts(tmp_path).start_deadline(seconds):
        assert hard_exits.ended.wait(10)  # a start that hangs
    minutes = f"{seconds / 60:g}"
    (call,) = hard_exits.calls
    assert call[0] == 1
    assert call[1].startswith(f"the accelerator did not start within {minutes} min: this attempt fails")
    assert "a second such start from this checkpoint refuses the next" in call[1] and "#93618" in call[1]
    (attempt,) = written(tmp_path)
    assert attempt["outcome"] == "failed"
    assert attempt["error"] == f"the accelerator did not start within {minutes} min (--start_minutes)"

    # a start on time: its timer is cancelled as the block ends (a deadline no stall of this machine's reaches, and
    # the timer's own thread waited for, not a sleep: the test does not depend on the machine's speed)
    timers: list[threading.Timer] = []

    class Recorded(threading.Timer):
        def start(self) -> None:
            timers.append(self)
            super().start()

    monkeypatch.setattr(attempts_module, "threading", SimpleNamespace(Timer=Recorded))  # the module's timers only
    on_time = tmp_path / "on-time"
    with attempts(on_time).start_deadline(600):
        pass
    (timer,) = timers
    timer.join(30)
    assert not timer.is_alive(), "the timer of a start on time was not cancelled"
    assert len(hard_exits.calls) == 1 and not (on_time / FILE).exists()
