"""A TPU that does not start, through the train step's own command (``components.train.main``, in this process so
that TensorFlow's initialisation can be the stand-in; everything else is real: the strategy's selection, the
classification, the attempts record, the exit status and the one line): an error a new start may not meet fails that
start only, any number of times; what every new job with the image would meet is a refusal the attempts record
counts."""

import json

import pytest
import tensorflow as tf

from components.lib.attempts import FILE, REPEATS, START_FAILED
from components.lib.job_runner import BAD_INPUT_EXIT
from components.lib.tpu_catalogue import TPU_RUNTIME_VARIABLES
from components.train import main

SLICE = "grpc://10.0.0.2:8470"  # a TPU by address: no device files looked for


def start(capsys, shards: dict, output, error: Exception) -> tuple[int, str]:
    """One start of the train step whose TPU initialisation raises ``error``: its exit status and last line."""

    def initialise(resolver):
        raise error

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tf.config, "experimental_connect_to_cluster", lambda resolver: None)
        patch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialise)
        for name in (*TPU_RUNTIME_VARIABLES, "TPU_LOAD_LIBRARY"):  # what the step sets, undone after it
            patch.delenv(name, raising=False)
        status = main(
            [
                *("--tokenizer", shards["tokenizer"], "--train_shards", shards["train"], "--model_config", "tiny"),
                *("--accelerator", "tpu", "--tpu", SLICE, "--max_steps", "10", "--output", str(output)),
            ]
        )
    return status, capsys.readouterr().err.strip().splitlines()[-1]


def outcomes(output) -> list[str]:
    return [attempt["outcome"] for attempt in json.loads((output / "checkpoints" / FILE).read_text())]


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_transient_start_failures_never_refuse_a_later_start_and_a_runtime_that_cannot_drive_the_tpu_is_refused(
    tmp_path, capsys, embedded_shards
):
    output = tmp_path / "model"
    for error in (
        tf.errors.UnavailableError(None, None, "Socket closed"),
        tf.errors.DeadlineExceededError(None, None, "Deadline Exceeded"),
        tf.errors.InternalError(None, None, "TPU chip 0 not responding"),
        tf.errors.AbortedError(None, None, "The TPU system is being reconfigured"),
    ):
        status, line = start(capsys, embedded_shards, output, error)
        assert status == 1, line  # Vertex AI restarts it, the launcher replaces its job: not 2, 3 or 4
        assert line.startswith(f"error: the TPU at --tpu='{SLICE}' did not start with ")
        assert f"({type(error).__name__}: {error.message}): an error a new start may not meet" in line
    assert outcomes(output) == [START_FAILED] * 4  # more than REPEATS, and the next start still runs

    no_kernel = tf.errors.NotFoundError(
        None,
        None,
        "TPUs not found in the cluster. Failed in initialization: No OpKernel was registered to support Op "
        "'ConfigureDistributedTPU' used by {{node ConfigureDistributedTPU}}",
    )
    for _ in range(REPEATS):
        status, line = start(capsys, embedded_shards, output, no_kernel)
        assert status == BAD_INPUT_EXIT and "this pair cannot drive this TPU" in line
    status, line = start(capsys, embedded_shards, output, no_kernel)  # not even initialised: the record refuses
    assert status == BAD_INPUT_EXIT and line.startswith(f"error: --checkpoint-dir='{output / 'checkpoints'}': the last")
    assert outcomes(output) == [START_FAILED] * 4 + ["failed"] * REPEATS
