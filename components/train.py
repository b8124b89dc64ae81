"""Pre-train a masked language model from scratch on TFRecord shards, on TPU, GPU or CPU.

The model is built from a config (``TFAutoModelForMaskedLM.from_config``) inside the strategy's scope
(``TPUStrategy`` on a TPU VM, ``MirroredStrategy`` on GPUs, the CPU otherwise). Shards stream through
``tf.data`` straight from their folder (local or ``gs://``) and are masked inside the graph. The optimizer
is the reference recipe's: AdamWeightDecay with linear warmup and decay (``transformers.create_optimizer``),
LayerNorm and biases excluded from decay.

Checkpoints (model, optimizer state, step) are written every ``--checkpoint_every_steps``; a restarted job
(Vertex AI restarts preempted TPU jobs) resumes from the last one with the learning-rate schedule intact.
TensorBoard logs carry loss, learning rate, samples/s, tokens/s and, where the accelerator's peak is known,
model FLOPs utilization (MFU). The output is a ``save_pretrained`` folder (config, TF weights, the same
weights in PyTorch's layout as ``model.safetensors``, tokenizer) and ``training_summary.json``, written last;
every checkpoint pushed to the Hub is such a folder too.

    python -m components.train --tokenizer /tmp/tok --train_shards /tmp/shards/train --model_config tiny \\
        --per_replica_batch_size 16 --max_steps 200 --output /tmp/model
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.attempts import Attempts
from components.lib.devices import peak_tflops_per_replica, prepare_runtime, select_strategy
from components.lib.errors import InvalidParameter
from components.lib.hub import BackgroundPush, create_repo, hub_token
from components.lib.jobs import run_job
from components.lib.masked_lm import MaskedLMScorer, masked_lm_loss, max_predictions
from components.lib.masking import Masking, masked_dataset, naming_corrupt_shards
from components.lib.preemption import STOPPED_EXIT, CallPace, StopRequest
from components.lib.pytorch_weights import save_model_folder
from components.lib.results import HISTORY_FILE, SUMMARY_FILE
from components.lib.tpu_catalogue import TPU_RUNTIME_VARIABLES
from components.lib.training import CHECKPOINT_IDENTITY_FILE, TrainingPlan, TrainingSettings, plan_training
from components.lib.training_log import LogWindow, format_point, write_summaries

log = logging.getLogger("tpu_mlm.train")


@dataclass(kw_only=True)
class TrainArguments(TrainingSettings):
    """The training's settings, and where the model, checkpoints and TensorBoard logs go."""

    output: str = field(
        default="", metadata={"help": "Folder for the trained model; defaults to $AIP_MODEL_DIR on Vertex AI."}
    )
    tensorboard_dir: str = field(default="", metadata={"help": "Defaults to $AIP_TENSORBOARD_LOG_DIR or OUTPUT/logs."})
    price_source: str = field(
        default="",
        metadata={"help": "Where --price_per_hour comes from, said with the cost (the pipeline's list prices)."},
    )
    start_minutes: float = field(
        default=20.0,
        metadata={
            "help": "The accelerator must be ready (the TPU initialised) within this many minutes: a start that hangs "
            "is a failed attempt, not a wait until the job's timeout that every restart and retry would pay again."
        },
    )

    def __post_init__(self) -> None:
        self.output = self.output or os.environ.get("AIP_MODEL_DIR", "")
        if not self.output:
            raise InvalidParameter("output", self.output, "is required (or set AIP_MODEL_DIR)")
        if self.start_minutes <= 0:
            raise InvalidParameter("start_minutes", self.start_minutes, "must be above 0")
        storage.check_uri("output", self.output)
        self.checkpoint_dir = (
            self.checkpoint_dir or os.environ.get("AIP_CHECKPOINT_DIR") or storage.join(self.output, "checkpoints")
        )
        self.tensorboard_dir = (
            self.tensorboard_dir or os.environ.get("AIP_TENSORBOARD_LOG_DIR") or storage.join(self.output, "logs")
        )
        storage.check_uri("tensorboard_dir", self.tensorboard_dir)
        super().__post_init__()


def train(arguments: TrainArguments) -> dict[str, Any]:
    """Trains (or resumes) and saves the model; returns the training summary."""
    with StopRequest() as stop:  # from the start: a preemption while the TPU starts or the step compiles is no failure
        prepare_runtime(arguments.accelerator, arguments.tpu)  # before TensorFlow loads, which the storage calls do
        settings = {k: v for k, v in asdict(arguments).items() if k not in ("output", "tensorboard_dir")}
        attempts = Attempts(arguments.checkpoint_dir, settings, (*TPU_RUNTIME_VARIABLES, "TF_XLA_FLAGS"))
        stop.on_stop.append(attempts.stopped)
        attempts.refuse_a_repeat()
        # a TPU that does not start, or hangs starting, is a failure to count, once it happens
        with attempts.recorded(begun=False), attempts.start_deadline(arguments.start_minutes * 60):
            strategy, kind = select_strategy(arguments.accelerator, arguments.tpu, arguments.replicas)
        plan = plan_training(arguments, strategy.num_replicas_in_sync)  # bad input: nothing written
        token = hub_token("hub_repo_id", arguments.hub_repo_id) if arguments.hub_repo_id else ""
        with attempts.recorded():
            return _train(arguments, plan, strategy, kind, token, stop)


def _train(
    arguments: TrainArguments, plan: TrainingPlan, strategy: Any, kind: str, token: str, stop: StopRequest
) -> dict[str, Any]:
    log.info(
        "%s strategy, %d replica(s), global batch %d (%d micro-batch(es) of %d per replica), %d steps",
        kind,
        strategy.num_replicas_in_sync,
        plan.global_batch_size,
        plan.accumulation,
        arguments.per_replica_batch_size,
        plan.total_steps,
    )
    if arguments.price_per_hour:
        log.info("cost at $%.2f an hour: %s", arguments.price_per_hour, arguments.price_source or "--price_per_hour")
    state = _set_up(arguments, plan, strategy)
    pusher = None
    if arguments.hub_repo_id:
        create_repo(arguments.hub_repo_id, token, arguments.hub_private)
        pusher = BackgroundPush(arguments.hub_repo_id, token)
    started = time.perf_counter()
    try:
        _training_loop(arguments, plan, strategy, kind, state, pusher, stop)
    finally:
        push_failures = pusher.close() if pusher else []
    summary = _summary(arguments, plan, strategy, kind, state, time.perf_counter() - started)
    summary["hub_push_failures"] = push_failures
    _save_model(state.model, plan.tokenizer, arguments.output, summary)
    return summary


@dataclass
class TrainingState:
    """The model, the optimizer and where training stands: what a checkpoint restores."""

    model: Any
    optimizer: Any
    schedule: Any
    checkpoint: Any
    manager: Any
    start_step: int
    history: list[dict[str, float]]  # log points so far, those of earlier runs of a resumed training included
    first_call_seconds: float | None = None  # this run's first call into the graph: tracing, compiling, its steps


def _set_up(arguments: TrainArguments, plan: TrainingPlan, strategy: Any) -> TrainingState:
    """Builds model and optimizer in the strategy's scope and restores the latest checkpoint, if any."""
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM, create_optimizer

    if arguments.bf16:
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    tf.keras.utils.set_random_seed(arguments.seed)
    with strategy.scope():
        model = TFAutoModelForMaskedLM.from_config(plan.config)
        model(model.dummy_inputs, training=False)  # create the variables, so a checkpoint can restore them
        optimizer, schedule = create_optimizer(
            init_lr=arguments.learning_rate,
            num_train_steps=plan.total_steps,
            num_warmup_steps=int(arguments.warmup_fraction * plan.total_steps),
            weight_decay_rate=arguments.weight_decay,
        )
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, arguments.checkpoint_dir, max_to_keep=3)
    identity_uri = storage.join(arguments.checkpoint_dir, CHECKPOINT_IDENTITY_FILE)  # plan_training checked it
    storage.write_text_atomic(identity_uri, json.dumps(plan.checkpoint_identity, indent=2) + "\n")
    history: list[dict[str, float]] = []
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint)
    start_step = int(optimizer.iterations.numpy())
    if start_step:
        log.info("resuming from %s at step %d of %d", manager.latest_checkpoint, start_step, plan.total_steps)
        history_uri = storage.join(arguments.checkpoint_dir, HISTORY_FILE)
        if storage.exists(history_uri):
            history = [p for p in json.loads(storage.read_text(history_uri)) if p["step"] <= start_step]
    return TrainingState(model, optimizer, schedule, checkpoint, manager, start_step, history)


def _training_loop(
    arguments: TrainArguments,
    plan: TrainingPlan,
    strategy: Any,
    kind: str,
    state: TrainingState,
    pusher: BackgroundPush | None,
    stop: StopRequest,
) -> None:
    """Runs the steps left in chunks that end at log and checkpoint boundaries."""
    import tensorflow as tf

    iterator, validation = _datasets(arguments, plan, strategy, state)
    predictions = max_predictions(plan.manifest["max_length"], arguments.mlm_probability)
    train_steps = _train_function(
        state.model, state.optimizer, strategy, _use_xla(arguments.xla, kind), predictions, plan.accumulation
    )
    shard_sources = (
        ("train_shards", arguments.train_shards, plan.manifest),
        ("eval_shards", arguments.eval_shards, plan.eval_manifest),
    )
    window = LogWindow(
        plan,
        plan.shape.model_flops_per_step,
        peak_tflops_per_replica(kind, arguments.peak_tflops or None),
        strategy.num_replicas_in_sync,
        arguments.price_per_hour,
    )
    storage.makedirs(arguments.tensorboard_dir)  # in a bucket: its marker, where the writer's own walk stops
    writer = tf.summary.create_file_writer(arguments.tensorboard_dir)
    step = state.start_step
    pace = CallPace()
    stop.in_loop = True  # a SIGTERM from here on is acted on between calls: checkpoint, then exit
    try:
        while step < plan.total_steps:
            boundaries = (
                plan.total_steps,
                _next_multiple(step, arguments.checkpoint_every_steps),
                _next_multiple(step, arguments.log_every_steps),
                step + arguments.steps_per_execution,
            )
            steps = min(min(boundaries) - step, pace.steps_per_call())
            with naming_corrupt_shards(*shard_sources):
                pace.start()
                loss = float(train_steps(iterator, tf.constant(steps, tf.int32)))
                pace.done(steps)
            step += steps
            window.add(steps, loss)
            if step % arguments.log_every_steps == 0 or step == plan.total_steps:
                point = window.point(step, float(state.schedule(step)))
                state.history.append(point)
                write_summaries(writer, point)
                log.info(format_point(point, plan.total_steps))
            if stop.requested and step < plan.total_steps:
                _save_checkpoint(arguments, state, step)  # no validation or Hub push: the grace period is short
                log.warning(
                    "SIGTERM: checkpoint at step %d of %d saved; a restarted job resumes there", step, plan.total_steps
                )
                writer.flush()
                raise SystemExit(STOPPED_EXIT)  # a failure, so that Vertex AI or the pipeline runs it again
            if step % arguments.checkpoint_every_steps == 0 or step == plan.total_steps:
                with naming_corrupt_shards(*shard_sources):
                    _at_checkpoint(arguments, plan, state, step, writer, validation, pusher)
    finally:
        stop.in_loop = False
    state.first_call_seconds = pace.first_call_seconds
    writer.flush()


def _datasets(
    arguments: TrainArguments, plan: TrainingPlan, strategy: Any, state: TrainingState
) -> tuple[Any, tuple[Any, MaskedLMScorer] | None]:
    """The distributed training stream (its shuffle seeded anew for a resumed run) and, with validation
    shards, their full batches and a scorer."""
    masking = Masking.from_manifest(plan.manifest, arguments.mlm_probability)
    dataset = masked_dataset(
        arguments.train_shards,
        plan.manifest,
        plan.micro_batch_size,
        masking,
        training=True,
        seed=arguments.seed + state.start_step,
        shuffle_buffer=arguments.shuffle_buffer,
    )
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    if plan.eval_manifest is None:
        return iterator, None
    batches = masked_dataset(
        arguments.eval_shards,
        plan.eval_manifest,
        plan.micro_batch_size,
        masking,
        training=False,
        drop_remainder=True,  # TPUs need full batches
    )
    predictions = max_predictions(plan.manifest["max_length"], arguments.mlm_probability)
    return iterator, (batches, MaskedLMScorer(state.model, strategy, predictions))


def _save_checkpoint(arguments: TrainArguments, state: TrainingState, step: int) -> None:
    # the history first: a kill between the two leaves points past the checkpoint, which a resume drops
    storage.write_text_atomic(
        storage.join(arguments.checkpoint_dir, HISTORY_FILE), json.dumps(state.history, indent=1) + "\n"
    )
    state.manager.save(checkpoint_number=step)


def _at_checkpoint(
    arguments: TrainArguments,
    plan: TrainingPlan,
    state: TrainingState,
    step: int,
    writer: Any,
    validation: tuple[Any, MaskedLMScorer] | None,
    pusher: BackgroundPush | None,
) -> None:
    """Saves the checkpoint and the history so far, hands a copy of the model to the background Hub push,
    and validates."""
    import tensorflow as tf

    _save_checkpoint(arguments, state, step)
    if pusher is not None:
        staging = Path(tempfile.mkdtemp(prefix="hub-checkpoint-"))
        save_model_folder(state.model, plan.tokenizer, staging)  # here: the push runs while training goes on
        pusher.submit(staging, f"Training checkpoint at step {step} of {plan.total_steps}")
    if validation is not None:
        dataset, score = validation
        metrics = score(dataset, arguments.eval_batches)
        with writer.as_default(step=step):
            tf.summary.scalar("eval/loss", metrics["loss"])
            tf.summary.scalar("eval/masked_accuracy", metrics["masked_accuracy"])
        log.info(
            "step %d: validation loss %.4f, masked accuracy %.4f", step, metrics["loss"], metrics["masked_accuracy"]
        )


def _summary(
    arguments: TrainArguments, plan: TrainingPlan, strategy: Any, kind: str, state: TrainingState, seconds: float
) -> dict[str, Any]:
    """What the run did; the loss figures cover the whole training, earlier runs of a resumed one included."""
    history = state.history
    this_run = [point for point in history if point["step"] > state.start_step]
    summary = {
        "total_steps": plan.total_steps,
        "resumed_from_step": state.start_step,
        "steps_this_run": plan.total_steps - state.start_step,
        "global_batch_size": plan.global_batch_size,
        "replicas": strategy.num_replicas_in_sync,
        "accelerator": kind,
        "samples": plan.shape.samples,
        "tokens": plan.shape.tokens,
        "seconds_this_run": round(seconds, 3),
        "first_call_seconds": state.first_call_seconds,
        "num_parameters": _num_parameters(state.model),
        "model_flops_per_step": plan.shape.model_flops_per_step,
        "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None,
        "history": history,
        "tokenizer_fingerprint": plan.manifest["tokenizer_fingerprint"],
        "corpus": plan.manifest["corpus"],
        "arguments": asdict(arguments),
    }
    if this_run:
        summary["samples_per_second"] = this_run[-1]["samples_per_second"]
    if arguments.price_per_hour:
        summary["cost_this_run"] = arguments.price_per_hour * seconds / 3600
        summary["price_source"] = arguments.price_source or "--price_per_hour"
    return summary


def _num_parameters(model: Any) -> int:
    return int(sum(math.prod(variable.shape) for variable in model.trainable_variables))


def _use_xla(choice: str, kind: str) -> bool:
    """XLA for the replica step on GPU or CPU when asked; never on a TPU, which compiles the whole step
    already (a nested jit_compile there is what the Keras maintainers warn against)."""
    return choice == "on" and kind != "tpu"


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _train_function(
    model: Any, optimizer: Any, strategy: Any, xla: bool, predictions: int, accumulation: int = 1
) -> Any:
    """A function running ``steps`` optimizer steps on batches from a distributed iterator in one call into the
    graph and returning their mean loss. Each step sums the gradients of ``accumulation`` micro-batches, one
    backward pass at a time, so that only one micro-batch's activations are held. The loss is summed on each
    replica's device and read once per call (on a TPU, no cross-replica reduction or host transfer each step)."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        mean_loss = tf.keras.metrics.Mean("train_loss")  # a variable per replica, summed across them on reading

    def replica_step(batches: tuple[dict[str, Any], ...]) -> None:
        gradients = None
        for batch in batches:
            with tf.GradientTape() as tape:
                loss = masked_lm_loss(model, batch, predictions)
                scaled = loss / (replicas * accumulation)  # gradients are summed over replicas and micro-batches
            micro = tape.gradient(scaled, model.trainable_variables)
            if accumulation > 1:  # summed as dense tensors (the embeddings' gradient comes as IndexedSlices)
                micro = [tf.convert_to_tensor(g) for g in micro]
            gradients = micro if gradients is None else [total + g for total, g in zip(gradients, micro, strict=True)]
            mean_loss.update_state(loss)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    if xla:
        replica_step = tf.function(replica_step, jit_compile=True)

    @tf.function
    def train_steps(iterator: Any, steps: Any) -> None:
        for _ in tf.range(steps):
            strategy.run(replica_step, args=(tuple(next(iterator) for _ in range(accumulation)),))

    def run(iterator: Any, steps: Any) -> Any:
        mean_loss.reset_state()
        train_steps(iterator, steps)
        return mean_loss.result()

    return run


def _save_model(model: Any, tokenizer: Any, output: str, summary: dict[str, Any]) -> None:
    """Publishes the ``save_pretrained`` folder with the tokenizer; the summary goes last, marking it done."""
    with tempfile.TemporaryDirectory() as staging:
        save_model_folder(model, tokenizer, Path(staging))
        Path(staging, SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
        storage.upload_folder(Path(staging), output, last=[SUMMARY_FILE])
    log.info("saved the model to %s", output)


def summary_for_people(summary: dict[str, Any]) -> str:
    done = f"{summary['steps_this_run']:,} step(s) of {summary['total_steps']:,} trained in this run"
    if summary["steps_this_run"]:
        done += f" on {summary['replicas']} x {summary['accelerator']} in {summary['seconds_this_run']:,.0f} s"
    if summary["first_loss"] is not None:
        done += f"; loss {summary['first_loss']:.4f} to {summary['last_loss']:.4f}"
    return f"{done}\nthe model and {SUMMARY_FILE}: {summary['arguments']['output']}"


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(TrainArguments, train, argv, description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
