"""Where a training stands: the model and optimizer built in the strategy's scope, the latest checkpoint
restored into them, and the log points so far; what a checkpoint saves and a restarted job resumes from, and what a
rewind after a divergence goes back to. No checkpoint is ever written from weights that are not finite. The rewinds
are the training's, kept beside its checkpoints: a restarted job counts those of the jobs before it."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from components.lib import storage
from components.lib.base_model import base_model_token, load_base_weights
from components.lib.errors import Diverged
from components.lib.modeling import pretraining_config
from components.lib.recipe import create_optimizer
from components.lib.results import HISTORY_FILE
from components.lib.training_plan import CHECKPOINT_IDENTITY_FILE, TrainingPlan

log = logging.getLogger("tpu_mlm.train")
REWINDS_FILE = "rewinds.json"  # in the checkpoint folder: every rewind of the training, whichever job made it


class WeightsNotFinite(Diverged):
    """A checkpoint asked for from weights that are not finite: none is written."""


@dataclass
class TrainingState:
    model: Any
    optimizer: Any
    schedule: Any
    manager: Any  # tf.train.CheckpointManager of the model and optimizer
    checkpoint_dir: str
    start_step: int
    history: list[dict[str, float]]  # log points so far, those of earlier runs of a resumed training included
    weights_finite: Callable[[], bool]  # finite_check's, over the model's and the optimizer's variables
    first_call_seconds: float | None = None  # this run's first call into the graph: tracing, compiling, its steps
    # the training's, earlier jobs' included: {"at_step": ..., "to_step": ...}
    rewinds: list[dict[str, int]] = field(default_factory=list)

    def save(self, step: int) -> None:
        """Checkpoints the model and optimizer at ``step``, whatever asked (the period, a SIGTERM): never from weights
        that are not finite, which would replace a good checkpoint that a resume or a rewind needs."""
        if not self.weights_finite():
            raise WeightsNotFinite(
                f"the model's weights are not finite at step {step}: no checkpoint written; the last good one is "
                f"{self.manager.latest_checkpoint or 'none'}",
                step,
            )
        # the history first: a kill between the two leaves points past the checkpoint, which a resume drops
        self.save_history()
        self.manager.save(checkpoint_number=step)

    def rewind(self, at_step: int) -> int:
        """Restores the last checkpoint into the model and optimizer (the schedule with them), drops the log points
        after it, and returns its step; the training's stream goes on, so the batches since are skipped. The rewind
        is written beside the checkpoints at once: a job that restarts before the next checkpoint still counts it."""
        self.manager.checkpoint.restore(self.manager.latest_checkpoint)
        step = int(self.optimizer.iterations.numpy())
        self.history = [point for point in self.history if point["step"] <= step]
        self.rewinds.append({"at_step": at_step, "to_step": step})
        rewinds = json.dumps(self.rewinds, indent=1) + "\n"
        storage.write_text_atomic(storage.join(self.checkpoint_dir, REWINDS_FILE), rewinds)
        return step

    def save_history(self) -> None:
        history = json.dumps(self.history, indent=1) + "\n"
        storage.write_text_atomic(storage.join(self.checkpoint_dir, HISTORY_FILE), history)

    def summary(self, settings: Any, plan: TrainingPlan, accelerator: str, seconds: float) -> dict[str, Any]:
        """What the run did; the loss figures cover the whole training, earlier runs of a resumed one included."""
        history = self.history
        this_run = [point for point in history if point["step"] > self.start_step]
        summary = {
            "total_steps": plan.total_steps,
            "resumed_from_step": self.start_step,
            "steps_this_run": plan.total_steps - self.start_step,
            "global_batch_size": plan.global_batch_size,
            "batch_stages": plan.shape.batch_stages,  # (first step, micro-batches a step): a batch warm-up's
            "replicas": plan.shape.replicas,
            "accelerator": accelerator,
            "samples": plan.shape.samples,
            "tokens": plan.shape.tokens,
            "seconds_this_run": round(seconds, 3),
            "first_call_seconds": self.first_call_seconds,
            "num_parameters": int(sum(math.prod(variable.shape) for variable in self.model.trainable_variables)),
            "model_flops_per_step": plan.shape.model_flops_per_step,
            "first_loss": history[0]["loss"] if history else None,
            "rewinds": self.rewinds,
            "last_loss": history[-1]["loss"] if history else None,
            "history": history,
            "tokenizer_fingerprint": plan.manifest["tokenizer_fingerprint"],
            "corpus": plan.manifest["corpus"],
            "arguments": asdict(settings),
        }
        if plan.init_from:  # the base at the commit it was read (a Hub revision pinned by the tokenizer step)
            summary["base_model"] = plan.init_from
        if this_run:
            summary["samples_per_second"] = this_run[-1]["samples_per_second"]
        if settings.price_per_hour:
            summary["cost_this_run"] = settings.price_per_hour * seconds / 3600
            summary["price_source"] = settings.price_source or "--price_per_hour"
        return summary


def finite_check(model: Any, optimizer: Any, strategy: Any) -> Callable[[], bool]:
    """A function saying whether every float weight of ``model`` and ``optimizer`` (its moments) is finite: one
    ``tf.function`` that runs a replica function over all of them through ``strategy.run``, as the train step does
    (on a TPU, one XLA program over the replicas' copies, not an op and a compile per variable shape), and reads one
    value back. Traced at its first call, once the optimizer has made its moments, and again only when the count of
    variables changes."""
    import tensorflow as tf

    def floats() -> list[Any]:
        return [variable for variable in (*model.weights, *optimizer.variables()) if variable.dtype.is_floating]

    def replica_not_finite() -> Any:  # 1 where a variable of this replica's holds a value that is not finite
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(variable)) for variable in floats()])
        return 1 - tf.cast(finite, tf.int32)

    @tf.function
    def replicas_not_finite(count: int) -> Any:  # count: a new trace when the variables change
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_not_finite), axis=None)

    return lambda: int(replicas_not_finite(len(floats()))) == 0


def start_or_resume(settings: Any, plan: TrainingPlan, strategy: Any, checkpoint_dir: str) -> TrainingState:
    """Builds model and optimizer in the strategy's scope and restores the latest checkpoint, if any."""
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM

    # set either way: a process that trained in bf16 before (the smoke test's probe after its run) must not
    # build this model in it
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16" if settings.bf16 else "float32")
    tf.keras.utils.set_random_seed(settings.seed)
    init_from = plan.init_from
    with strategy.scope():
        config = pretraining_config(plan.config, settings.dropout)
        if init_from and not tf.train.latest_checkpoint(checkpoint_dir):  # a resume restores its own weights
            log.info("starting from %s's weights", init_from)
            model = load_base_weights(init_from, config, base_model_token(init_from))
        else:
            model = TFAutoModelForMaskedLM.from_config(config)
        model.config = plan.config  # its layers keep the pre-training dropout; what it saves is the config's
        model(model.dummy_inputs, training=False)  # create the variables, so a checkpoint can restore them
        optimizer, schedule = create_optimizer(settings, plan.total_steps, plan.shape.learning_rate_scales)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=3)
    identity_uri = storage.join(checkpoint_dir, CHECKPOINT_IDENTITY_FILE)  # plan_training checked it
    storage.write_text_atomic(identity_uri, json.dumps(plan.checkpoint_identity, indent=2) + "\n")
    history: list[dict[str, float]] = []
    rewinds: list[dict[str, int]] = []
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint)
    start_step = int(optimizer.iterations.numpy())
    if start_step:
        log.info("resuming from %s at step %d of %d", manager.latest_checkpoint, start_step, plan.total_steps)
        history_uri = storage.join(checkpoint_dir, HISTORY_FILE)
        if storage.exists(history_uri):
            history = [p for p in json.loads(storage.read_text(history_uri)) if p["step"] <= start_step]
        rewinds_uri = storage.join(checkpoint_dir, REWINDS_FILE)
        if storage.exists(rewinds_uri):
            rewinds = json.loads(storage.read_text(rewinds_uri))
    finite = finite_check(model, optimizer, strategy)
    return TrainingState(
        model, optimizer, schedule, manager, checkpoint_dir, start_step, history, finite, rewinds=rewinds
    )
