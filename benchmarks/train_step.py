"""The train step's own throughput, samples/s, at 1 and N CPU replicas: what a change to the step itself (its
dtypes, where the loss is reduced) costs or saves, measured the same way before and after.

Each replica count runs in a process of its own (TensorFlow splits the CPU only before it creates its devices):
the embedded corpus sharded once, the ``tiny`` model, ``--steps`` optimizer steps timed after one warm-up call
(tracing), ``steps_per_execution`` steps per call as the train step runs them; the best of ``--repeats``.

    python benchmarks/train_step.py [--replicas 1,2] [--per_replica_batch_size 16] [--steps 300]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

import components  # noqa: F401  (environment for TensorFlow)


@dataclass
class StepBenchmarkArguments:
    replicas: str = field(default="1,2", metadata={"help": "Replica counts, comma-separated."})
    per_replica_batch_size: int = field(default=16, metadata={"help": "Samples per replica and step."})
    steps: int = field(default=300, metadata={"help": "Steps timed per repeat."})
    steps_per_execution: int = field(default=50, metadata={"help": "Steps per call into the graph."})
    repeats: int = field(default=3, metadata={"help": "Timed repeats; the best counts."})
    output: str = field(default="benchmarks/results/train_step.json", metadata={"help": "JSON results."})
    shards: str = field(default="", metadata={"help": "Internal: the shard folder a replica process reads."})
    one_replica_count: int = field(default=0, metadata={"help": "Internal: time this replica count only."})


def make_shards(root: Path) -> tuple[str, str]:
    from components.shards import ShardArguments, write_shards
    from components.tokenizer import TokenizerArguments, train_tokenizer

    tokenizer = str(root / "tokenizer")
    train_tokenizer(TokenizerArguments(output=tokenizer, corpus="embedded", vocab_size=5000))
    write_shards(ShardArguments(output=str(root / "shards"), tokenizer=tokenizer, corpus="embedded"))
    return tokenizer, str(root / "shards")


def time_replicas(arguments: StepBenchmarkArguments) -> dict[str, float]:
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM, create_optimizer

    from components.lib.devices import select_strategy
    from components.lib.input_pipeline import Masking, training_dataset
    from components.lib.masked_lm import max_predictions
    from components.lib.modeling import model_config
    from components.lib.run_shape import settings_shape
    from components.lib.shard_set import read_manifest
    from components.lib.train_function import train_function

    replicas = arguments.one_replica_count
    strategy, _ = select_strategy("cpu", replicas=replicas)
    manifest = read_manifest(arguments.shards)
    shape = settings_shape(
        vars(arguments), replicas=replicas, max_length=manifest["max_length"], samples=None, max_steps=1
    )
    with strategy.scope():
        model = TFAutoModelForMaskedLM.from_config(model_config("tiny", manifest))
        model(model.dummy_inputs, training=False)
        optimizer, _ = create_optimizer(1e-3, num_train_steps=100_000, num_warmup_steps=100)
    masking = Masking.from_manifest(manifest)
    dataset = training_dataset(arguments.shards, manifest, shape.global_batch_size, masking)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    steps = train_function(model, optimizer, strategy, False, max_predictions(manifest["max_length"], 0.15))
    chunk = tf.constant(arguments.steps_per_execution, tf.int32)
    float(steps(iterator, chunk)[0])  # tracing
    best = 0.0
    for _ in range(arguments.repeats):
        started = time.perf_counter()
        for _ in range(arguments.steps // arguments.steps_per_execution):
            loss = float(steps(iterator, chunk)[0])
        elapsed = time.perf_counter() - started
        best = max(best, arguments.steps * shape.global_batch_size / elapsed)
    return {"replicas": replicas, "samples_per_second": best, "last_loss": loss}


def main() -> None:
    (arguments,) = HfArgumentParser(StepBenchmarkArguments, allow_abbrev=False).parse_args_into_dataclasses()
    if arguments.one_replica_count:
        print(json.dumps(time_replicas(arguments)))
        return
    results = {"command": " ".join(["python", *sys.argv]), "arguments": asdict(arguments), "runs": []}
    with tempfile.TemporaryDirectory() as root:
        _, shards = make_shards(Path(root))
        for replicas in (int(count) for count in arguments.replicas.split(",")):
            command = [sys.executable, __file__, "--shards", shards, "--one_replica_count", str(replicas)]
            for name in ("per_replica_batch_size", "steps", "steps_per_execution", "repeats"):
                command += [f"--{name}", str(getattr(arguments, name))]
            run = json.loads(
                subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
            results["runs"].append(run)
            print(f"{replicas} replica(s): {run['samples_per_second']:,.1f} samples/s", file=sys.stderr)
    Path(arguments.output).parent.mkdir(parents=True, exist_ok=True)
    Path(arguments.output).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
