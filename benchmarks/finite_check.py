"""What the check that a checkpoint's weights are finite costs on ``roberta-base`` (its weights and AdamWeightDecay's
two moments): the train step's compiled check (``training_state.finite_check``: one ``tf.function`` over every
variable through ``strategy.run``) against the eager check it replaced (an ``is_finite`` and a ``reduce_all`` a
variable, op by op), on this machine's CPU. Each timed after one warm-up call (the compiled check's tracing, timed
apart); the median of ``--repeats``.

    python benchmarks/finite_check.py [--repeats 20] [--vocab_size 50265]
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

import components  # noqa: F401  (environment for TensorFlow)


@dataclass
class FiniteCheckArguments:
    repeats: int = field(default=20, metadata={"help": "Timed calls of each check; the median counts."})
    vocab_size: int = field(default=50265, metadata={"help": "roberta-base's own vocabulary by default."})
    output: str = field(default="benchmarks/results/finite_check.json", metadata={"help": "JSON results."})


def eager_check(variables: list) -> bool:
    """The check before issue 44: a few eager ops a variable, one value read back."""
    import tensorflow as tf

    return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(variable)) for variable in variables]))


def seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        assert call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    (arguments,) = HfArgumentParser(FiniteCheckArguments, allow_abbrev=False).parse_args_into_dataclasses()
    import tensorflow as tf
    from transformers import AdamWeightDecay, AutoConfig, TFAutoModelForMaskedLM

    from components.lib.modeling import PRESETS
    from components.lib.training_state import finite_check

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")  # the train step's on one CPU
    values = {**PRESETS["roberta-base"], "vocab_size": arguments.vocab_size}
    with strategy.scope():
        model = TFAutoModelForMaskedLM.from_config(AutoConfig.for_model(values.pop("model_type"), **values))
        model(model.dummy_inputs, training=False)
        optimizer = AdamWeightDecay(learning_rate=1e-4)
    trainable = model.trainable_variables
    zeros = [tf.zeros_like(variable) for variable in trainable]
    # the two moments, made as the first step makes them
    strategy.run(lambda: optimizer.apply_gradients(zip(zeros, trainable, strict=True)))
    variables = [v for v in (*model.weights, *optimizer.variables()) if v.dtype.is_floating]
    floats = sum(int(tf.size(variable)) for variable in variables)

    compiled = finite_check(model, optimizer, strategy)
    started = time.perf_counter()
    assert compiled()
    first_call = time.perf_counter() - started
    eager_check(variables)  # warm-up: the eager kernels' first run
    results = {
        "arguments": asdict(arguments),
        "tensorflow": tf.__version__,
        "variables": len(variables),
        "float_values": floats,
        "bytes_read": floats * 4,
        "eager_seconds": seconds(lambda: eager_check(variables), arguments.repeats),
        "compiled_first_call_seconds": first_call,
        "compiled_seconds": seconds(compiled, arguments.repeats),
    }
    Path(arguments.output).parent.mkdir(parents=True, exist_ok=True)
    Path(arguments.output).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
