"""Where a pipeline run keeps what it writes, by the run's name (its Vertex AI pipeline job id, which ``submit``
chooses and prints; the last part of ``projects/P/locations/R/pipelineJobs/NAME``). One place for the folders that
the train step checkpoints to, ``submit --resume`` resumes from, ``status`` reads progress from and ``clean``
deletes."""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Sequence
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter

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
LABEL_VALUE_LENGTH = 63  # Google Cloud's longest label value
LABEL_HASH_LENGTH = 8


def run_label(run: str) -> str:
    """The run's name as a label value: itself up to 63 characters; a longer one cut, with a short hash of the whole
    name after the cut, so that two long names that begin alike still label apart."""
    name = run_name(run)
    if len(name) <= LABEL_VALUE_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:LABEL_HASH_LENGTH]
    return f"{name[: LABEL_VALUE_LENGTH - LABEL_HASH_LENGTH - 1]}-{digest}"


def run_root(parameters: dict[str, Any], pipeline_root: str) -> str:
    """The root of a run's own folders (its checkpoints, its TensorBoard logs, with or without a Vertex AI
    TensorBoard): the run's ``output_root`` parameter when it names one, else its pipeline root."""
    return parameters.get("output_root") or pipeline_root


def run_checkpoint_folder(parameters: dict[str, Any], pipeline_root: str, run: str) -> str:
    """Where the run's train step checkpoints: the run's ``checkpoint_dir`` parameter when it names one, else
    ``checkpoint_folder`` under its ``run_root``."""
    return parameters.get("checkpoint_dir") or checkpoint_folder(run_root(parameters, pipeline_root), run_name(run))
