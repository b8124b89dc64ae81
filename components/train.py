"""Pre-train a masked language model from scratch on TFRecord shards, on TPU, GPU or CPU, or continue a model's
pre-training (``--init_from``: its weights and config, ``lib/base_model.py``).

The model is built from a config (``TFAutoModelForMaskedLM.from_config``, or loaded with the base's weights) inside
the strategy's scope
(``TPUStrategy`` on a TPU VM, ``MirroredStrategy`` on GPUs, the CPU otherwise). Shards stream through
``tf.data`` straight from their folder (local or ``gs://``) and are masked inside the graph. The optimizer
is the recipe's (``lib/recipe.py``), the step's function ``lib/train_function.py``; the model, optimizer and
checkpoints live in ``lib/training_state.py``; this file is the loop.

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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage, verdict
from components.lib.attempts import RUN_VARIABLE, Attempts
from components.lib.devices import peak_tflops_per_replica, prepare_runtime, select_strategy
from components.lib.errors import Diverged, InvalidParameter
from components.lib.hub import BackgroundPush, create_repo, hub_token
from components.lib.input_pipeline import (
    EVALUATION_MLM_PROBABILITY,
    input_pipelines,
    naming_corrupt_shards,
    training_streams,
)
from components.lib.job_runner import run_job
from components.lib.lease import EXPIRY_SECONDS, HEARTBEATS_IN_EXPIRY, Lease
from components.lib.masked_lm import MaskedLMScorer, max_predictions
from components.lib.preemption import STOPPED_EXIT, CallPace, StopRequest
from components.lib.pytorch_weights import save_model_folder
from components.lib.recipe import highest_mlm_probability
from components.lib.results import SUMMARY_FILE
from components.lib.tpu_catalogue import TPU_RUNTIME_VARIABLES, TPU_START_MINUTES
from components.lib.train_function import train_function
from components.lib.training_log import LogWindow, format_point, last_step_in_tensorboard, write_summaries
from components.lib.training_plan import TrainingPlan, TrainingSettings, plan_training
from components.lib.training_state import TrainingState, WeightsNotFinite, start_or_resume

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
        default=TPU_START_MINUTES,
        metadata={
            "help": "The accelerator must be ready (the TPU initialised) within this many minutes: a start that hangs "
            "is a failed attempt, not a wait until the job's timeout that every restart and retry would pay again."
        },
    )

    lease_seconds: float = field(
        default=EXPIRY_SECONDS,
        metadata={
            "help": "One training per checkpoint folder: the step holds its lease (lease.json there), renewed "
            f"{HEARTBEATS_IN_EXPIRY} times within this many seconds; a lease not renewed for this long is a dead "
            "training's. A start that finds another training's lease waits up to this long: renewed, it is refused; "
            "not, it takes the lease over."
        },
    )

    def __post_init__(self) -> None:
        self.output = self.output or os.environ.get("AIP_MODEL_DIR", "")
        if not self.output:
            raise InvalidParameter("output", self.output, "is required (or set AIP_MODEL_DIR)")
        if self.start_minutes <= 0:
            raise InvalidParameter("start_minutes", self.start_minutes, "must be above 0")
        if self.lease_seconds <= 0:
            raise InvalidParameter("lease_seconds", self.lease_seconds, "must be above 0")
        storage.check_uri("output", self.output)
        self.checkpoint_dir = (
            self.checkpoint_dir or os.environ.get("AIP_CHECKPOINT_DIR") or storage.join(self.output, "checkpoints")
        )
        self.tensorboard_dir = (
            self.tensorboard_dir or os.environ.get("AIP_TENSORBOARD_LOG_DIR") or storage.join(self.output, "logs")
        )
        storage.check_uri("tensorboard_dir", self.tensorboard_dir)
        super().__post_init__()


def train(arguments: TrainArguments, run: str = "") -> dict[str, Any]:
    """Trains (or resumes) and saves the model; returns the training summary. ``run``: the pipeline run training,
    named in the checkpoint folder's lease."""
    with StopRequest() as stop:  # from the start: a preemption while the TPU starts or the step compiles is no failure
        prepare_runtime(arguments.accelerator, arguments.tpu)  # before TensorFlow loads, which the storage calls do
        # one training per checkpoint folder, from before the TPU starts until the step ends, however it ends
        run = run or os.environ.get(RUN_VARIABLE, "")
        with Lease(arguments.checkpoint_dir, arguments.lease_seconds, run).held():
            settings = {
                k: v for k, v in asdict(arguments).items() if k not in ("output", "tensorboard_dir", "lease_seconds")
            }
            attempts = Attempts(arguments.checkpoint_dir, settings, (*TPU_RUNTIME_VARIABLES, "TF_XLA_FLAGS"))
            stop.on_stop.append(attempts.stopped)
            attempts.refuse_a_repeat()
            # a TPU that does not start, or hangs starting, is a failure to count, once it happens
            with attempts.recorded(begun=False), attempts.start_deadline(arguments.start_minutes * 60):
                strategy, kind = select_strategy(arguments.accelerator, arguments.tpu, arguments.replicas)
            # bad input: nothing written
            plan = plan_training(
                arguments,
                strategy.num_replicas_in_sync,
                input_pipelines=input_pipelines(strategy),
                on_tpu=kind == "tpu",
            )
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
    if len(plan.shape.batch_stages) > 1:
        stages = ", ".join(f"{micro} from step {start}" for start, micro in plan.shape.batch_stages)
        log.info("batch warm-up: micro-batches a step %s", stages)
    if arguments.price_per_hour:
        log.info("cost at $%.2f an hour: %s", arguments.price_per_hour, arguments.price_source or "--price_per_hour")
    state = start_or_resume(arguments, plan, strategy, arguments.checkpoint_dir)
    pusher = None
    if arguments.hub_repo_id:
        create_repo(arguments.hub_repo_id, token, arguments.hub_private)
        pusher = BackgroundPush(arguments.hub_repo_id, token)
    started = time.perf_counter()
    # the streams outlive the save: deleting the training iterator can wait on tf.data's autotuning threads where
    # it prefetches to each device (many replicas, TPUs), and the model is published before that wait
    streams = training_streams(arguments, plan, strategy, state.start_step)
    try:
        _training_loop(TrainingRun(arguments, plan, strategy, kind, state, pusher, stop), streams)
    finally:
        push_failures = pusher.close() if pusher else []
    summary = state.summary(arguments, plan, kind, time.perf_counter() - started)
    summary["hub_push_failures"] = push_failures
    _save_model(state.model, plan.tokenizer, arguments.output, summary)
    return summary


@dataclass
class TrainingRun:
    """What the loop and its checkpoints share: the settings and plan, where the run trains, the model's state,
    and where its progress goes (TensorBoard, the Hub push) or comes from (a SIGTERM's request)."""

    arguments: TrainArguments
    plan: TrainingPlan
    strategy: Any
    kind: str  # tpu, gpu or cpu
    state: TrainingState
    pusher: BackgroundPush | None
    stop: StopRequest
    writer: Any = None  # TensorBoard's, made by the loop


def _training_loop(run: TrainingRun, streams: tuple[Any, Any, Any]) -> None:
    """Runs the steps left in chunks that end at log and checkpoint boundaries and at the batch warm-up's stages
    (a step function for each stage's micro-batches). A stage after the first compiles its function mid-run, longer
    than a preemption's notice: a checkpoint comes first, and that call runs one step (its pace is not known)."""
    import tensorflow as tf

    arguments, plan, strategy, state, stop = run.arguments, run.plan, run.strategy, run.state, run.stop
    shape = plan.shape
    iterator, validation_stream, masking = streams
    max_length = plan.manifest["max_length"]
    scorer = MaskedLMScorer(state.model, strategy, max_predictions(max_length, EVALUATION_MLM_PROBABILITY))
    validation = None if validation_stream is None else (validation_stream, scorer)
    predictions = max_predictions(max_length, highest_mlm_probability(arguments))
    xla = _use_xla(arguments.xla, run.kind)
    train_steps = {  # by micro-batches a step; each compiles on its first call
        micro: train_function(state.model, state.optimizer, strategy, xla, predictions, micro, arguments.clip_norm)
        for micro in sorted({micro for _, micro in shape.batch_stages})
    }
    shard_sources = (
        ("train_shards", arguments.train_shards, plan.manifest),
        ("eval_shards", arguments.eval_shards, plan.eval_manifest),
    )
    window = LogWindow(
        plan,
        peak_tflops_per_replica(run.kind, arguments.peak_tflops or None),
        strategy.num_replicas_in_sync,
        arguments.price_per_hour,
    )
    storage.makedirs(arguments.tensorboard_dir)  # in a bucket: its marker, where the writer's own walk stops
    run.writer = writer = tf.summary.create_file_writer(arguments.tensorboard_dir)
    step = saved = state.start_step  # saved: the step of the last checkpoint this loop knows of
    skipped = 0  # micro-batches the stream went past in rewinds
    # the last step with a point in TensorBoard: a rewind's steps up to where it diverged are there already, and so
    # are a resumed training's up to where its earlier job got; TensorBoard would keep both points of a step written
    # twice (TF2's writers write no SessionLog.START, which is what its loader purges on,
    # tensorboard/backend/event_processing/plugin_event_accumulator.py)
    in_tensorboard = last_step_in_tensorboard(arguments.tensorboard_dir) if state.start_step else 0
    compiled: set[int] = set()  # the step functions called so far, by micro-batches
    pace = CallPace()

    def rewind_or_stop(what: str) -> None:
        """Goes back to the last checkpoint after ``what`` was found not finite at ``step`` (or stops the run)."""
        nonlocal step, saved, skipped
        rewound_to = _rewind_or_stop(run, step, what)
        skipped += shape.micro_batches_before(step) - shape.micro_batches_before(rewound_to)
        step = saved = rewound_to
        window.restart()

    def saved_or_rewound(save: Callable[[int], None]) -> bool:
        """Runs ``save`` at ``step`` (a checkpoint first); with weights that are not finite, nothing is saved and,
        under ``--on_divergence rewind``, the run rewinds (False) rather than stops."""
        try:
            save(step)
        except WeightsNotFinite:
            if arguments.on_divergence != "rewind":
                raise
            rewind_or_stop("the model's weights are not finite")
            return False
        return True

    stop.in_loop = True  # a SIGTERM from here on is acted on between calls: checkpoint, then exit
    try:
        while step < plan.total_steps:
            boundaries = (
                plan.total_steps,
                _next_multiple(step, arguments.checkpoint_every_steps),
                _next_multiple(step, arguments.log_every_steps),
                step + arguments.steps_per_execution,
                shape.next_stage_start(step),
            )
            steps = min(min(boundaries) - step, pace.steps_per_call())
            micro = shape.accumulation_at(step)
            if compiled and micro not in compiled:
                if saved != step:
                    if not saved_or_rewound(state.save):
                        continue
                    saved = step
                log.info("step %d: the batch warm-up's next stage, %d micro-batch(es) a step, compiles", step, micro)
                steps = 1
            compiled.add(micro)
            run_steps = train_steps[micro]
            with naming_corrupt_shards(*shard_sources):
                pace.start()
                loss, gradient_norm = (float(value) for value in run_steps(iterator, tf.constant(steps, tf.int32)))
                pace.done(steps)
            samples = shape.samples_before(step + steps) - shape.samples_before(step)
            step += steps
            if not (math.isfinite(loss) and math.isfinite(gradient_norm)):
                rewind_or_stop(f"the loss is {loss} and the gradient norm {gradient_norm}")
                continue
            window.add(steps, samples, loss, gradient_norm)
            if step % arguments.log_every_steps == 0 or step == plan.total_steps:
                # of the stream's next batch, which rewinds moved on past the batches they skipped
                read = shape.micro_batches_before(step) - shape.micro_batches_before(state.start_step) + skipped
                point = window.point(step, float(state.schedule(step)), float(masking.rate(read)))
                state.history.append(point)
                if step > in_tensorboard:
                    write_summaries(writer, point)
                    in_tensorboard = step
                log.info(format_point(point, plan.total_steps))
            if stop.requested and step < plan.total_steps:
                # no validation or Hub push: the grace period is short
                saved_now = saved_or_rewound(state.save)
                log.warning(
                    "SIGTERM: checkpoint at step %d of %d %s; a restarted job resumes there",
                    step,
                    plan.total_steps,
                    "saved" if saved_now else "kept (the weights were not finite: rewound to it)",
                )
                writer.flush()
                raise SystemExit(STOPPED_EXIT)  # a failure, so that Vertex AI or the pipeline runs it again
            if step % arguments.checkpoint_every_steps == 0 or step == plan.total_steps:
                with naming_corrupt_shards(*shard_sources):
                    if not saved_or_rewound(lambda at: _at_checkpoint(run, at, validation)):
                        continue
                saved = step
                if _rehearses_a_restart(run, step):
                    log.warning(
                        "step %d: rehearsing a preemption (--rehearse_restart): exiting as a preempted job does; "
                        "Vertex AI's restart resumes from this checkpoint",
                        step,
                    )
                    writer.flush()
                    raise SystemExit(STOPPED_EXIT)
    finally:
        stop.in_loop = False
    state.first_call_seconds = pace.first_call_seconds
    writer.flush()


def _rehearses_a_restart(run: TrainingRun, step: int) -> bool:
    """Whether the loop exits now to rehearse a restart: once, at the first checkpoint before the end of a training
    that started from nothing, inside the TPU job the launcher created (where Vertex AI restarts the worker)."""
    rehearsing = run.arguments.rehearse_restart and run.state.start_step == 0 and step < run.plan.total_steps
    return rehearsing and bool(verdict.verdict_file())


def _at_checkpoint(run: TrainingRun, step: int, validation: tuple[Callable[..., Any], MaskedLMScorer] | None) -> None:
    """Saves the checkpoint and the history so far, hands a copy of the model to the background Hub push,
    and validates."""
    import tensorflow as tf

    state = run.state
    state.save(step)
    if run.pusher is not None:
        staging = Path(tempfile.mkdtemp(prefix="hub-checkpoint-"))
        save_model_folder(state.model, run.plan.tokenizer, staging)  # here: the push runs while training goes on
        run.pusher.submit(staging, f"Training checkpoint at step {step} of {run.plan.total_steps}")
    if validation is not None:
        stream, score = validation
        metrics = score(stream, run.arguments.eval_batches)
        with run.writer.as_default(step=step):
            tf.summary.scalar("eval/loss", metrics["loss"])
            tf.summary.scalar("eval/masked_accuracy", metrics["masked_accuracy"])
        log.info(
            "step %d: validation loss %.4f, masked accuracy %.4f", step, metrics["loss"], metrics["masked_accuracy"]
        )
        for point in state.history:
            if point["step"] == step:
                point.update(eval_loss=metrics["loss"], eval_masked_accuracy=metrics["masked_accuracy"])
        state.save_history()  # with the validation: a rerun that finds every step done reports it too


def _rewind_or_stop(run: TrainingRun, step: int, what: str) -> int:
    """After a call whose loss or gradient norm is not finite, or a checkpoint asked for from weights that are not
    (``what`` was seen at ``step``): the step of the last checkpoint, restored, where the run rewinds
    (``--on_divergence rewind``, at most ``--max_rewinds`` times in the training, its earlier jobs' rewinds
    included); else ``Diverged``, with nothing saved from these weights and what to try."""
    arguments, state = run.arguments, run.state
    learning_rate = float(state.schedule(step))
    latest = state.manager.latest_checkpoint
    seen = f"{what} at step {step} (learning rate {learning_rate:.2e})"
    if arguments.on_divergence == "rewind" and latest and len(state.rewinds) < arguments.max_rewinds:
        to_step = state.rewind(step)
        log.warning(
            "diverged: %s; rewind %d of at most %d: back to the checkpoint of step %d, skipping the batches of steps "
            "%d to %d",
            seen,
            len(state.rewinds),
            arguments.max_rewinds,
            to_step,
            to_step + 1,
            step,
        )
        return to_step
    if arguments.on_divergence == "rewind":
        why = (
            f"{len(state.rewinds)} rewind(s) done in this training, its earlier jobs' included, at most "
            f"{arguments.max_rewinds}"
            if latest
            else "no checkpoint yet"
        )
        stopped = f"stopped ({why})"
    else:
        stopped = "stopped"
    clip = arguments.clip_norm
    clipping = f"tighter clipping (--clip_norm {clip / 2:g}" if clip else "clipping (--clip_norm 1.0"
    raise Diverged(
        f"the training diverged: {seen}; {stopped}, with no checkpoint or model written from these weights (the "
        f"last good checkpoint: {latest or 'none'}). Try --on_divergence rewind (back to the last checkpoint, "
        "skipping the batches after it), or, in a new checkpoint_dir (a checkpoint folder keeps its recipe), a lower "
        f"peak learning rate (--learning_rate, now {arguments.learning_rate:g}) or {clipping}; now {clip:g})",
        step,
    )


def _use_xla(choice: str, kind: str) -> bool:
    """XLA for the replica step on GPU or CPU when asked; never on a TPU, which compiles the whole step
    already (a nested jit_compile there is what the Keras maintainers warn against)."""
    return choice == "on" and kind != "tpu"


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _save_model(model: Any, tokenizer: Any, output: str, summary: dict[str, Any]) -> None:
    """Publishes the ``save_pretrained`` folder with the tokenizer; the summary goes last, marking it done. The
    weights are those of the last checkpoint, which ``TrainingState.save`` wrote only after finding them finite."""
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
