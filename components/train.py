"""Pre-train a masked language model from scratch on TFRecord shards, on TPU, GPU or CPU.

The model is built from a config (``TFAutoModelForMaskedLM.from_config``) inside the strategy's scope
(``TPUStrategy`` on a TPU VM, ``MirroredStrategy`` on GPUs, the CPU otherwise). Shards stream through
``tf.data`` straight from their folder (local or ``gs://``) and are masked inside the graph. The optimizer
is the reference recipe's: AdamWeightDecay with linear warmup and decay (``transformers.create_optimizer``),
LayerNorm and biases excluded from decay.

Checkpoints (model, optimizer state, step) are written every ``--checkpoint_every_steps``; a restarted job
(Vertex AI restarts preempted TPU jobs) resumes from the last one with the learning-rate schedule intact.
TensorBoard logs carry loss, learning rate, samples/s, tokens/s and, where the accelerator's peak is known,
model FLOPs utilization (MFU). The output is a ``save_pretrained`` folder (config, TF weights, tokenizer)
and ``training_summary.json``, written last.

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

from components import storage
from components.accelerators import ACCELERATORS, check_accelerator, peak_tflops_per_replica, select_strategy
from components.cli import run_job
from components.data import Masking, masked_dataset, naming_corrupt_shards
from components.errors import InvalidParameter
from components.hub import BackgroundPush, check_repo_id, create_repo, hub_token
from components.masked_lm import MaskedLMScorer, check_probability, masked_lm_loss, max_predictions
from components.modeling import PRESETS, model_config, training_flops_per_token
from components.shards import read_manifest, verify_files
from components.tokenizer import load_tokenizer

log = logging.getLogger("tpu_mlm.train")

SUMMARY_FILE = "training_summary.json"
# Written beside the checkpoints at each one: the log points so far, so a resumed run reports the whole training.
HISTORY_FILE = "training_history.json"
# Written beside the checkpoints: what they are checkpoints of, so that resuming with another model is refused.
CHECKPOINT_IDENTITY_FILE = "checkpoint_identity.json"
NOT_ARCHITECTURE = ("transformers_version", "_name_or_path", "architectures")  # config keys that are bookkeeping
XLA_CHOICES = ("auto", "on", "off")


@dataclass
class TrainArguments:
    tokenizer: str = field(metadata={"help": "Tokenizer folder (local or gs://)."})
    train_shards: str = field(metadata={"help": "Training shard folder with manifest.json."})
    output: str = field(
        default="", metadata={"help": "Folder for the trained model; defaults to $AIP_MODEL_DIR on Vertex AI."}
    )
    eval_shards: str = field(default="", metadata={"help": "Validation shards: loss logged at each checkpoint."})
    model_config: str = field(
        default="roberta-base",
        metadata={"help": f"Preset {sorted(PRESETS)}, a config.json path/URI, or a Hub model name."},
    )
    per_replica_batch_size: int = field(default=256, metadata={"help": "Samples per replica and step."})
    num_epochs: int = field(default=1, metadata={"help": "Passes over the training shards."})
    max_steps: int = field(default=0, metadata={"help": "Total optimizer steps; overrides num_epochs when > 0."})
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak learning rate."})
    warmup_fraction: float = field(default=0.05, metadata={"help": "Fraction of steps of linear warmup."})
    weight_decay: float = field(default=1e-3, metadata={"help": "Decoupled weight decay rate."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Fraction of tokens masked."})
    bf16: bool = field(default=False, metadata={"help": "Mixed bfloat16 precision (TPUs, recent GPUs)."})
    steps_per_execution: int = field(default=50, metadata={"help": "Steps run per call into the graph."})
    xla: str = field(
        default="auto",
        metadata={
            "help": "XLA-compile the replica step on GPU/CPU: on, off, auto (off). Never nested on a TPU, which "
            "compiles the whole step anyway.",
            "choices": XLA_CHOICES,
        },
    )
    shuffle_buffer: int = field(default=10_000, metadata={"help": "Samples in the shuffle buffer."})
    seed: int = field(default=42, metadata={"help": "Seed of initialization, shuffling and masking."})
    checkpoint_every_steps: int = field(default=1_000, metadata={"help": "Steps between checkpoints."})
    log_every_steps: int = field(default=100, metadata={"help": "Steps between log lines and TensorBoard points."})
    eval_batches: int = field(default=20, metadata={"help": "Validation batches at each checkpoint."})
    accelerator: str = field(
        default="auto", metadata={"help": "auto, tpu, gpu or cpu; tpu/gpu fail if absent.", "choices": ACCELERATORS}
    )
    replicas: int = field(
        default=0,
        metadata={
            "help": "Replicas: 0 for every device of the accelerator. A TPU or the GPUs found must have exactly "
            "this many; on the CPU, N > 1 splits it into N logical devices (rehearse a v3-8 with 8)."
        },
    )
    tpu: str = field(default="local", metadata={"help": "TPU name for TPUClusterResolver ('local' on TPU VMs)."})
    peak_tflops: float | None = field(
        default=None, metadata={"help": "Peak TFLOP/s of one replica, for MFU where it is not known."}
    )
    price_per_hour: float = field(
        default=0.0,
        metadata={"help": "Price of the accelerator per hour: the log lines show the cost so far and projected."},
    )
    hub_repo_id: str = field(
        default="", metadata={"help": "Push each checkpoint to this Hub repository (HF_TOKEN); off when empty."}
    )
    hub_private: bool = field(default=True, metadata={"help": "Create the checkpoint repository as private."})
    checkpoint_dir: str = field(default="", metadata={"help": "Defaults to $AIP_CHECKPOINT_DIR or OUTPUT/checkpoints."})
    tensorboard_dir: str = field(default="", metadata={"help": "Defaults to $AIP_TENSORBOARD_LOG_DIR or OUTPUT/logs."})

    def __post_init__(self) -> None:
        self.output = self.output or os.environ.get("AIP_MODEL_DIR", "")
        if not self.output:
            raise InvalidParameter("output", self.output, "is required (or set AIP_MODEL_DIR)")
        self.checkpoint_dir = (
            self.checkpoint_dir or os.environ.get("AIP_CHECKPOINT_DIR") or storage.join(self.output, "checkpoints")
        )
        self.tensorboard_dir = (
            self.tensorboard_dir or os.environ.get("AIP_TENSORBOARD_LOG_DIR") or storage.join(self.output, "logs")
        )
        for parameter in ("tokenizer", "train_shards", "output", "checkpoint_dir", "tensorboard_dir"):
            storage.check_uri(parameter, getattr(self, parameter))
        if self.eval_shards:
            storage.check_uri("eval_shards", self.eval_shards)
        for parameter in (
            "per_replica_batch_size",
            "num_epochs",
            "steps_per_execution",
            "shuffle_buffer",
            "checkpoint_every_steps",
            "log_every_steps",
            "eval_batches",
        ):
            if getattr(self, parameter) < 1:
                raise InvalidParameter(parameter, getattr(self, parameter), "must be a positive whole number")
        if self.max_steps < 0:
            raise InvalidParameter("max_steps", self.max_steps, "must be 0 (use num_epochs) or positive")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise InvalidParameter("learning_rate", self.learning_rate, "must be a positive number (1e-4 is usual)")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise InvalidParameter("warmup_fraction", self.warmup_fraction, "must be at least 0 and below 1")
        if self.weight_decay < 0:
            raise InvalidParameter("weight_decay", self.weight_decay, "must be 0 or positive")
        check_probability(self.mlm_probability)
        check_accelerator(self.accelerator, self.replicas)
        if self.xla not in XLA_CHOICES:
            raise InvalidParameter("xla", self.xla, f"must be one of {XLA_CHOICES}")
        if self.hub_repo_id:
            check_repo_id("hub_repo_id", self.hub_repo_id)


@dataclass
class TrainingPlan:
    """What the checks before training settled: data, model config and step counts."""

    manifest: dict[str, Any]
    eval_manifest: dict[str, Any] | None
    config: Any
    tokenizer: Any
    total_steps: int
    global_batch_size: int
    checkpoint_identity: dict[str, Any]


def plan_training(arguments: TrainArguments, num_replicas: int) -> TrainingPlan:
    """Every check that can fail before the accelerator is used: tokenizer, shards, config, batch arithmetic."""
    tokenizer, tokenizer_fingerprint = load_tokenizer(arguments.tokenizer)
    manifest = read_manifest(arguments.train_shards, "train_shards")
    eval_manifest = read_manifest(arguments.eval_shards, "eval_shards") if arguments.eval_shards else None
    for parameter, shards in (("train_shards", manifest), ("eval_shards", eval_manifest)):
        if shards is None:
            continue
        verify_files(getattr(arguments, parameter), shards, parameter)
        if shards["tokenizer_fingerprint"] != tokenizer_fingerprint:
            raise InvalidParameter(
                parameter,
                getattr(arguments, parameter),
                f"were made with another tokenizer ({shards['tokenizer_fingerprint']}) than --tokenizer "
                f"({tokenizer_fingerprint})",
            )
        if shards["max_length"] != manifest["max_length"]:
            raise InvalidParameter(
                parameter,
                getattr(arguments, parameter),
                f"have max_length {shards['max_length']}, the training shards {manifest['max_length']}",
            )
    config = model_config(arguments.model_config, manifest)
    global_batch = arguments.per_replica_batch_size * num_replicas
    if global_batch > manifest["num_records"]:
        raise InvalidParameter(
            "per_replica_batch_size",
            arguments.per_replica_batch_size,
            f"x {num_replicas} replica(s) = global batch {global_batch}, more than the "
            f"{manifest['num_records']} training samples",
        )
    if eval_manifest is not None and global_batch > eval_manifest["num_records"]:
        raise InvalidParameter(
            "eval_shards",
            arguments.eval_shards,
            f"hold {eval_manifest['num_records']} samples, fewer than one global batch of {global_batch}",
        )
    steps_per_epoch = manifest["num_records"] // global_batch
    total_steps = arguments.max_steps or arguments.num_epochs * steps_per_epoch
    identity = checkpoint_identity(config, tokenizer_fingerprint)
    check_checkpoints_match(arguments.checkpoint_dir, identity)
    return TrainingPlan(manifest, eval_manifest, config, tokenizer, total_steps, global_batch, identity)


def checkpoint_identity(config: Any, tokenizer_fingerprint: str) -> dict[str, Any]:
    """What checkpoints must share to be resumed: the model's architecture and the tokenizer."""
    architecture = {k: v for k, v in config.to_dict().items() if k not in NOT_ARCHITECTURE}
    return json.loads(json.dumps({"model_config": architecture, "tokenizer_fingerprint": tokenizer_fingerprint}))


def check_checkpoints_match(checkpoint_dir: str, identity: dict[str, Any]) -> None:
    """Refuses a checkpoint folder that holds checkpoints of another model or tokenizer (a stable
    ``--checkpoint_dir`` reused by mistake) before any accelerator time is spent."""
    uri = storage.join(checkpoint_dir, CHECKPOINT_IDENTITY_FILE)
    if not storage.exists(uri):
        return
    existing = json.loads(storage.read_text(uri))
    differing = sorted(
        key for key in identity["model_config"] if existing["model_config"].get(key) != identity["model_config"][key]
    )
    if existing["tokenizer_fingerprint"] != identity["tokenizer_fingerprint"]:
        differing.append("tokenizer")
    if differing:
        raise InvalidParameter(
            "checkpoint_dir",
            checkpoint_dir,
            f"holds checkpoints of another model ({', '.join(differing)} differ); resume with the same model "
            "config and tokenizer, or use an empty folder",
        )


def train(arguments: TrainArguments) -> dict[str, Any]:
    """Trains (or resumes) and saves the model; returns the training summary."""
    strategy, kind = select_strategy(arguments.accelerator, arguments.tpu, arguments.replicas)
    plan = plan_training(arguments, strategy.num_replicas_in_sync)
    log.info(
        "%s strategy, %d replica(s), global batch %d, %d steps",
        kind,
        strategy.num_replicas_in_sync,
        plan.global_batch_size,
        plan.total_steps,
    )
    token = hub_token("hub_repo_id", arguments.hub_repo_id) if arguments.hub_repo_id else ""
    state = _set_up(arguments, plan, strategy)
    pusher = None
    if arguments.hub_repo_id:
        create_repo(arguments.hub_repo_id, token, arguments.hub_private)
        pusher = BackgroundPush(arguments.hub_repo_id, token)
    started = time.perf_counter()
    try:
        _training_loop(arguments, plan, strategy, kind, state, pusher)
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
) -> None:
    """Runs the steps left in chunks that end at log and checkpoint boundaries."""
    import tensorflow as tf

    masking = Masking.from_manifest(plan.manifest, arguments.mlm_probability)
    predictions = max_predictions(plan.manifest["max_length"], arguments.mlm_probability)
    dataset = masked_dataset(
        arguments.train_shards,
        plan.manifest,
        plan.global_batch_size,
        masking,
        training=True,
        seed=arguments.seed + state.start_step,
        shuffle_buffer=arguments.shuffle_buffer,
    )
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    train_steps = _train_function(state.model, state.optimizer, strategy, _use_xla(arguments.xla, kind), predictions)
    validation = None
    if plan.eval_manifest is not None:
        batches = masked_dataset(
            arguments.eval_shards,
            plan.eval_manifest,
            plan.global_batch_size,
            masking,
            training=False,
            drop_remainder=True,  # TPUs need full batches
        )
        validation = (batches, MaskedLMScorer(state.model, strategy, predictions))
    shard_sources = (
        ("train_shards", arguments.train_shards, plan.manifest),
        ("eval_shards", arguments.eval_shards, plan.eval_manifest),
    )
    max_length = plan.manifest["max_length"]
    flops_per_step = _model_flops_per_step(plan, state.model)
    peak = peak_tflops_per_replica(kind, arguments.peak_tflops)
    writer = tf.summary.create_file_writer(arguments.tensorboard_dir)
    step, window_started = state.start_step, time.perf_counter()
    run_started = window_started
    window_steps, window_loss = 0, 0.0
    while step < plan.total_steps:
        boundaries = (
            plan.total_steps,
            _next_multiple(step, arguments.checkpoint_every_steps),
            _next_multiple(step, arguments.log_every_steps),
            step + arguments.steps_per_execution,
        )
        steps = min(boundaries) - step
        with naming_corrupt_shards(*shard_sources):
            loss = float(train_steps(iterator, tf.constant(steps, tf.int32)))
        step += steps
        window_steps, window_loss = window_steps + steps, window_loss + loss * steps
        if step % arguments.log_every_steps == 0 or step == plan.total_steps:
            seconds = time.perf_counter() - window_started
            point = _log_point(
                step,
                window_loss / window_steps,
                float(state.schedule(step)),
                window_steps * plan.global_batch_size / seconds,
                max_length,
                flops_per_step * window_steps / seconds,
                peak,
                strategy.num_replicas_in_sync,
            )
            point["eta_seconds"] = (plan.total_steps - step) * seconds / window_steps
            if arguments.price_per_hour:
                elapsed = time.perf_counter() - run_started
                point["cost_so_far"] = arguments.price_per_hour * elapsed / 3600
                point["projected_cost"] = arguments.price_per_hour * (elapsed + point["eta_seconds"]) / 3600
            state.history.append(point)
            _write_summaries(writer, point)
            log.info(_format_point(point, plan.total_steps))
            window_started, window_steps, window_loss = time.perf_counter(), 0, 0.0
        if step % arguments.checkpoint_every_steps == 0 or step == plan.total_steps:
            with naming_corrupt_shards(*shard_sources):
                _at_checkpoint(arguments, plan, state, step, writer, validation, pusher)
    writer.flush()


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

    # the history first: a kill between the two leaves points past the checkpoint, which a resume drops
    storage.write_text_atomic(
        storage.join(arguments.checkpoint_dir, HISTORY_FILE), json.dumps(state.history, indent=1) + "\n"
    )
    state.manager.save(checkpoint_number=step)
    if pusher is not None:
        staging = Path(tempfile.mkdtemp(prefix="hub-checkpoint-"))
        _save_pretrained(state.model, plan.tokenizer, staging)  # here: the push runs while training goes on
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
    tokens_per_step = plan.global_batch_size * plan.manifest["max_length"]
    summary = {
        "total_steps": plan.total_steps,
        "resumed_from_step": state.start_step,
        "steps_this_run": plan.total_steps - state.start_step,
        "global_batch_size": plan.global_batch_size,
        "replicas": strategy.num_replicas_in_sync,
        "accelerator": kind,
        "samples": plan.total_steps * plan.global_batch_size,
        "tokens": plan.total_steps * tokens_per_step,
        "seconds_this_run": round(seconds, 3),
        "num_parameters": _num_parameters(state.model),
        "model_flops_per_step": _model_flops_per_step(plan, state.model),
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
    return summary


def loss_summary(summary: dict[str, Any]) -> str:
    """The training loss at the first and last log point, for reports and model cards; a rerun that found
    every step done shows the figures of the runs that trained (kept beside the checkpoints)."""
    if summary["first_loss"] is None:
        return "none logged (the checkpoints came from a run that kept no log)"
    history = summary["history"]
    text = f"{summary['first_loss']:.4f} at step {history[0]['step']:,}, {summary['last_loss']:.4f} at step "
    text += f"{history[-1]['step']:,}"
    if not summary["steps_this_run"]:
        text += f" (this run found all {summary['total_steps']:,} steps done and trained none)"
    return text


def _num_parameters(model: Any) -> int:
    return int(sum(math.prod(variable.shape) for variable in model.trainable_variables))


def _model_flops_per_step(plan: TrainingPlan, model: Any) -> float:
    max_length = plan.manifest["max_length"]
    per_token = training_flops_per_token(plan.config, _num_parameters(model), max_length)
    return per_token * plan.global_batch_size * max_length


def _use_xla(choice: str, kind: str) -> bool:
    """XLA for the replica step on GPU or CPU when asked; never on a TPU, which compiles the whole step
    already (a nested jit_compile there is what the Keras maintainers warn against)."""
    return choice == "on" and kind != "tpu"


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _train_function(model: Any, optimizer: Any, strategy: Any, xla: bool, predictions: int) -> Any:
    """A graph function running ``steps`` optimizer steps on batches from a distributed iterator and
    returning their mean loss."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync

    def replica_step(batch: dict[str, Any]) -> Any:
        with tf.GradientTape() as tape:
            loss = masked_lm_loss(model, batch, predictions)
            scaled = loss / replicas  # gradients are summed over replicas
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    if xla:
        replica_step = tf.function(replica_step, jit_compile=True)

    @tf.function
    def train_steps(iterator: Any, steps: Any) -> Any:
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            per_replica = strategy.run(replica_step, args=(next(iterator),))
            total += strategy.reduce("MEAN", per_replica, axis=None)
        return total / tf.cast(steps, tf.float32)

    return train_steps


def _log_point(
    step: int,
    loss: float,
    learning_rate: float,
    samples_per_second: float,
    tokens_per_sample: int,
    flops_per_second: float,
    peak_tflops: float | None,
    replicas: int,
) -> dict[str, float]:
    point = {
        "step": step,
        "loss": loss,
        "learning_rate": learning_rate,
        "samples_per_second": samples_per_second,
        "tokens_per_second": samples_per_second * tokens_per_sample,
        "model_tflops_per_second": flops_per_second / 1e12,
    }
    if peak_tflops:
        point["mfu"] = flops_per_second / (peak_tflops * 1e12 * replicas)
    return point


def _write_summaries(writer: Any, point: dict[str, float]) -> None:
    import tensorflow as tf

    with writer.as_default(step=int(point["step"])):
        for name, value in point.items():
            if name != "step":
                tf.summary.scalar(f"train/{name}", value)


def _format_point(point: dict[str, float], total_steps: int) -> str:
    line = (
        f"step {int(point['step'])}/{total_steps}: loss {point['loss']:.4f}, lr {point['learning_rate']:.2e}, "
        f"{point['samples_per_second']:,.1f} samples/s, {point['tokens_per_second']:,.0f} tokens/s"
    )
    if "mfu" in point:
        line += f", MFU {point['mfu']:.1%}"
    eta = int(point["eta_seconds"])
    line += f", ETA {eta // 3600}:{eta % 3600 // 60:02d}:{eta % 60:02d}"
    if "cost_so_far" in point:
        line += f", ${point['cost_so_far']:,.2f} so far of about ${point['projected_cost']:,.2f}"
    return line


def _save_model(model: Any, tokenizer: Any, output: str, summary: dict[str, Any]) -> None:
    """Publishes the ``save_pretrained`` folder with the tokenizer; the summary goes last, marking it done."""
    with tempfile.TemporaryDirectory() as staging:
        _save_pretrained(model, tokenizer, Path(staging))
        Path(staging, SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
        storage.upload_folder(Path(staging), output, last=[SUMMARY_FILE])
    log.info("saved the model to %s", output)


def _save_pretrained(model: Any, tokenizer: Any, folder: Path) -> None:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(TrainArguments, train, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
