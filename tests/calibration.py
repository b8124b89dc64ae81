"""A fixed piece of the work a pipeline step does, timed on this machine now: what a test divides a run's time by,
so that a time budget holds on a slow machine and at a slow hour (this 2-core machine has run at half its speed
for hours) yet still fails when the run itself grows.

The work is a step's in small: a fresh Python process that imports TensorFlow and transformers, builds make run's
``mini`` masked-LM model and trains it for ``STEPS`` steps of 64 samples of 32 tokens (make run's shape), as the
train step does after its start. Run as a script, it prints its seconds; ``calibration_seconds`` times it.

    python tests/calibration.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
STEPS = 100


def calibration_seconds() -> float:
    """The wall seconds of the calibration process, start to end."""
    started = time.perf_counter()
    subprocess.run([sys.executable, __file__], cwd=PROJECT, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - started


def main() -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    sys.path.insert(0, str(PROJECT))
    import numpy as np
    import tensorflow as tf
    from transformers import RobertaConfig, TFAutoModelForMaskedLM

    from components.lib.modeling import PRESETS

    tf.keras.utils.set_random_seed(0)
    config = RobertaConfig(**{**PRESETS["mini"], "vocab_size": 1_000, "max_position_embeddings": 34})
    model = TFAutoModelForMaskedLM.from_config(config)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))  # the model's own masked-LM loss
    ids = np.random.default_rng(0).integers(5, config.vocab_size, size=(64 * STEPS, 32), dtype="int32")
    labels = np.where(np.random.default_rng(1).random(ids.shape) < 0.15, ids, -100)
    model.fit({"input_ids": ids, "labels": labels}, batch_size=64, epochs=1, verbose=0)


if __name__ == "__main__":
    main()
