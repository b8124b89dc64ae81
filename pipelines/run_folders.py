"""Where a pipeline run keeps what it writes, by the run's name (its Vertex AI pipeline job id, which ``submit``
chooses and prints; the last part of ``projects/P/locations/R/pipelineJobs/NAME``). One place for the folders that
the train step checkpoints to, ``submit --resume`` resumes from, ``status`` reads progress from and ``clean``
deletes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.attempts import RUN_VARIABLE
from components.lib.errors import InvalidParameter

PIPELINE_NAME = "tpu-mlm-pretraining"  # the compiled pipeline's name: what marks a pipeline job as this project's
CHECKPOINTS = "checkpoints"
# a Vertex AI pipeline job id: lowercase letters, digits and hyphens, a letter first, at most 128 characters
RUN_NAME = re.compile(r"[a-z][a-z0-9-]{0,127}")


def run_name(run: str, parameter: str = "run") -> str:
    """The run's name from its name or its resource name; refused in one line, naming ``parameter``, when it cannot
    be a job id."""
    name = run.strip().rstrip("/").rsplit("/", 1)[-1]
    if not RUN_NAME.fullmatch(name):
        raise InvalidParameter(
            parameter, run, "must be a pipeline run's name (lowercase letters, digits and '-', as submit prints it)"
        )
    return name


def run_as_flag(argv: Sequence[str] | None) -> list[str]:
    """A command's arguments with a first word that is no flag (``tpu-mlm status RUN ...``) as ``--run RUN``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return ["--run", *argv] if argv and not argv[0].startswith("-") else argv


def checkpoint_folder(root: str, run: str) -> str:
    """The run's own checkpoints: ``ROOT/checkpoints/NAME``, ROOT being the run's output_root, else its pipeline
    root. Every restart of the TPU job and every retry of the train task finds them there."""
    return storage.join(root, CHECKPOINTS, run)


TENSORBOARD = "tensorboard"


def tensorboard_folder(root: str, run: str) -> str:
    """The run's TensorBoard logs: ``ROOT/tensorboard/NAME``, so that ``tensorboard --logdir ROOT/tensorboard`` shows
    every run under ROOT side by side, each by its name ("" gives that folder of all runs)."""
    return storage.join(root, TENSORBOARD, run) if run else storage.join(root, TENSORBOARD)


# the label that ties a run's TPU custom jobs to it (the launcher sets it; status, logs and cancel list by it)
RUN_NAME_LABEL = "tpu-mlm-run"
# the label of a run submit --resume made: the run_label of the run whose checkpoints it trains in (clean reads it)
RESUMED_FROM_LABEL = "tpu-mlm-resumed-from"
LABEL_VALUE_LENGTH = 63  # Google Cloud's longest label value
LABEL_HASH_LENGTH = 12


def run_label(run: str) -> str:
    """The run's name as a label value: itself up to 63 characters; a longer one cut, with "_" and a hash of the
    whole name after the cut. A run's name has no "_", so no other run's name is ever the label of a long one, and
    two long names that begin alike label apart."""
    name = run_name(run)
    if len(name) <= LABEL_VALUE_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:LABEL_HASH_LENGTH]
    return f"{name[: LABEL_VALUE_LENGTH - LABEL_HASH_LENGTH - 1]}_{digest}"


def run_root(parameters: dict[str, Any], pipeline_root: str) -> str:
    """The root of a run's own folders (its checkpoints, its TensorBoard logs, with or without a Vertex AI
    TensorBoard): the run's ``output_root`` parameter when it names one, else its pipeline root."""
    return parameters.get("output_root") or pipeline_root


def run_checkpoint_folder(parameters: dict[str, Any], pipeline_root: str, run: str) -> str:
    """Where the run's train step checkpoints: the run's ``checkpoint_dir`` parameter when it names one, else
    ``checkpoint_folder`` under its ``run_root``."""
    return parameters.get("checkpoint_dir") or checkpoint_folder(run_root(parameters, pipeline_root), run_name(run))


# kfp.local keeps no record of a run but its folder: run-local writes this one in it, which ``clean`` reads to prove
# the folder is a run of this pipeline, whether it is over, and where it put its data and checkpoints
LOCAL_RUN_RECORD = "tpu-mlm-run.json"
RUNNING = "running"


def read_local_run_record(run_folder: str) -> dict[str, Any] | None:
    """A kfp.local run's record (``LOCAL_RUN_RECORD`` in its folder); None when there is none, or it is not this
    pipeline's."""
    uri = storage.join(run_folder, LOCAL_RUN_RECORD)
    if not storage.exists(uri):
        return None
    try:
        record = json.loads(storage.read_text(uri))
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("pipeline") != PIPELINE_NAME:
        return None
    fields = {"host": str, "pid": int, "state": str, "output_root": str, "checkpoint_dir": str}
    wrong = [name for name, kind in fields.items() if not isinstance(record.get(name), kind)]
    if not wrong and not 0 < record["pid"] < 2**31:  # a process id of this machine, os.kill's to ask
        wrong = ["pid"]
    if wrong:  # run-local writes every field: this one was written or changed by hand
        raise InvalidParameter("run", run_folder, f"its {LOCAL_RUN_RECORD} is not as run-local writes it ({wrong[0]})")
    return record


def local_run_alive(record: dict[str, Any]) -> str:
    """Why the kfp.local run of ``record`` may still be running, or "" when it is over: it said it ended, or its
    run-local process (on this machine) is gone."""
    if record.get("state") != RUNNING:
        return ""
    if record.get("host") != socket.gethostname():
        return f"it is running on {record.get('host')!r} (since {record.get('started')}), another machine"
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return ""  # killed without a word: over
    except PermissionError:
        pass  # a process of another user has the number: taken as alive
    return f"its run-local process {record['pid']} is running (since {record.get('started')})"


@contextmanager
def local_run_recorded(run_dir: Callable[[], Path | None], values: dict[str, Any]) -> Iterator[None]:
    """Writes the kfp.local run's record as soon as kfp.local makes its folder (it does when its first task runs),
    running, then how it ended. ``values`` are the run's parameters (its output_root and checkpoint_dir)."""
    record = {
        "pipeline": PIPELINE_NAME,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "state": RUNNING,
        "output_root": values.get("output_root", ""),
        "checkpoint_dir": values.get("checkpoint_dir", ""),
    }
    ended = threading.Event()

    def write(folder: Path) -> None:
        storage.write_text_atomic(str(folder / LOCAL_RUN_RECORD), json.dumps(record, indent=1) + "\n")
        # the run's later steps (subprocesses of this one) name it in their checkpoint folder's attempts
        os.environ[RUN_VARIABLE] = folder.name

    def watch() -> None:
        while not ended.wait(0.05):
            folder = run_dir()
            if folder is not None:
                write(folder)
                return

    watcher = threading.Thread(target=watch, name="local-run-record", daemon=True)
    watcher.start()
    try:
        yield
        record["state"] = "succeeded"
    except BaseException:
        record["state"] = "failed"
        raise
    finally:
        ended.set()
        watcher.join()
        record["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        folder = run_dir()
        if folder is not None:
            write(folder)
        os.environ.pop(RUN_VARIABLE, None)
