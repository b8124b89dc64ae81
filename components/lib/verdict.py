"""A TPU job's verdict: how the step that ran inside a Vertex AI custom job ended, written where the pipeline's
launcher (``pipelines/launch_custom_job.py``) reads it.

Vertex AI restarts a worker whose container exits non-zero (in the same VM, up to 5 times), then retries the whole
job (up to 3 times), unless it judges the error permanent, and which exit statuses it judges so is not documented.
An outcome the step knows would come again (bad input, a refusal by Google Cloud, a diverged loss, a slice that did
not come up) would be paid for again at each restart. So inside a job that the launcher created, such an outcome is
written here and the container exits 0: the job ends at once, and the launcher ends the pipeline task with the
status and the one line. Only an unknown failure (a crash, a preemption the step could not finish) exits non-zero
and is left to Vertex AI's restarts and the launcher's replacement.

A TPU that did not start for a reason a new job (another VM) may get past ends the job the same way, with status 1:
the launcher's next try creates a new job rather than Vertex AI restarting it on the same VM.

The launcher names the file in the environment of the jobs it creates (``VERDICT_VARIABLE``), and that alone turns
verdicts on: Vertex AI's own ``CLOUD_ML_JOB_ID`` (read by Google's ``aiplatform.training_utils``, but in no page of
Vertex AI's documentation found) is recorded where it is set, not relied on. Anywhere else (a terminal, CI,
run-local, a pipeline's CPU step) nothing is written and the exit statuses stay as they are.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("tpu_mlm")

VERDICT_VARIABLE = "TPU_MLM_VERDICT"  # the file (gs:// on Vertex AI) the launcher reads the job's verdict from
JOB_ID_VARIABLE = "CLOUD_ML_JOB_ID"  # set by Vertex AI in a custom job's containers


@dataclass(frozen=True)
class Verdict:
    """``status``: the exit status the step would have ended with (0: it finished); ``line``: its one line; ``step``:
    the training step it ended at, where known; ``resumed_from_step``: the checkpoint a finished training resumed
    from (0: none); ``job``: the custom job's id, where Vertex AI set it; ``written``: when (seconds since the
    epoch: a slice's hosts take only a verdict written after they started)."""

    status: int
    line: str
    step: int | None = None
    resumed_from_step: int = 0
    job: str = ""
    written: float = 0.0


def verdict_file() -> str:
    """The file this process's verdict goes to: the one the launcher named in its TPU job; "" anywhere else."""
    return os.environ.get(VERDICT_VARIABLE, "")


def record(status: int, line: str, step: int | None = None, resumed_from_step: int = 0) -> bool:
    """Writes the verdict where the launcher reads it; whether it was written (never outside the launcher's job, or
    where the write failed: then the step exits with ``status`` as it would anywhere else)."""
    uri = verdict_file()
    if not uri:
        return False
    from components.lib import storage

    verdict = Verdict(status, line, step, resumed_from_step, os.environ.get(JOB_ID_VARIABLE, ""), time.time())
    try:
        storage.write_text_atomic(uri, json.dumps(asdict(verdict)) + "\n")
    except Exception as error:  # the outcome matters more than its record: exit as without one
        log.error("could not write the verdict to %s (%s): exiting with status %d", uri, error, status)
        return False
    if status:
        log.info("verdict written to %s: the job ends (exit 0); the launcher reads status %d", uri, status)
    return True


def read(uri: str) -> Verdict | None:
    """The verdict at ``uri``, or None where the job wrote none."""
    from components.lib import storage

    if not storage.exists(uri):
        return None
    values: dict[str, Any] = json.loads(storage.read_text(uri))
    return Verdict(**{key: values[key] for key in Verdict.__dataclass_fields__ if key in values})


def written_since(seconds: float) -> Verdict | None:
    """This job's verdict if one was written after ``seconds`` (since the epoch; one of an earlier start of the job
    does not count), else None."""
    uri = verdict_file()
    found = read(uri) if uri else None
    return found if found is not None and found.written >= seconds else None
