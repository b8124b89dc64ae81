"""The training step: one call into the graph runs a number of optimizer steps on every replica, each summing its
micro-batches' gradients, summing them over the replicas, clipping them once and applying them."""

from __future__ import annotations

from typing import Any

from components.lib.masked_lm import masked_lm_loss


def train_function(
    model: Any,
    optimizer: Any,
    strategy: Any,
    xla: bool,
    predictions: int,
    accumulation: int = 1,
    clip_norm: float = 0.0,
) -> Any:
    """A function running ``steps`` optimizer steps on batches from a distributed iterator in one call into the
    graph and returning their mean loss and mean global gradient norm. Each step sums the gradients of
    ``accumulation`` micro-batches, one backward pass at a time, so that only one micro-batch's activations are
    held. The gradient is summed over every replica before it is applied: its global norm is the step's (logged,
    and watched for divergence), and with ``clip_norm`` it is clipped to that norm once. Loss and norm are summed on
    each replica's device and read once per call (on a TPU, no host transfer each step); a non-finite value in any
    step of the call makes its mean non-finite."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        mean_loss = tf.keras.metrics.Mean("train_loss")  # a variable per replica, summed across them on reading
        mean_norm = tf.keras.metrics.Mean("gradient_norm")

    def replica_step(batches: tuple[dict[str, Any], ...]) -> None:
        gradients = None
        for batch in batches:
            with tf.GradientTape() as tape:
                loss = masked_lm_loss(model, batch, predictions)
                scaled = loss / (replicas * accumulation)  # gradients are summed over replicas and micro-batches
            micro = tape.gradient(scaled, model.trainable_variables)
            micro = [tf.convert_to_tensor(g) for g in micro]  # dense: the embeddings' gradient comes as IndexedSlices
            gradients = micro if gradients is None else [total + g for total, g in zip(gradients, micro, strict=True)]
            mean_loss.update_state(loss)
        # the replicas' sum here, which apply_gradients would otherwise make itself, so that the norm is the step's
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        norm = tf.linalg.global_norm(summed)
        mean_norm.update_state(norm)
        if clip_norm:
            summed, _ = tf.clip_by_global_norm(summed, clip_norm, use_norm=norm)
        pairs = zip(summed, model.trainable_variables, strict=True)
        optimizer.apply_gradients(pairs, experimental_aggregate_gradients=False)

    if xla:
        replica_step = tf.function(replica_step, jit_compile=True)

    @tf.function
    def train_steps(iterator: Any, steps: Any) -> None:
        for _ in tf.range(steps):
            strategy.run(replica_step, args=(tuple(next(iterator) for _ in range(accumulation)),))

    def run(iterator: Any, steps: Any) -> tuple[Any, Any]:
        mean_loss.reset_state()
        mean_norm.reset_state()
        train_steps(iterator, steps)
        return mean_loss.result(), mean_norm.result()

    return run
