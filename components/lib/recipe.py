"""The recipe's optimization: the optimizer with its learning-rate schedule, and the training step that applies
it to a micro-batch stream on every replica. The train step and the benchmarks build their steps here."""

from __future__ import annotations

from typing import Any

from components.lib.masked_lm import masked_lm_loss


def create_optimizer(settings: Any, total_steps: int) -> tuple[Any, Any]:
    """(optimizer, schedule): the reference recipe's AdamWeightDecay with linear warmup and decay
    (``transformers.create_optimizer``), LayerNorm and biases excluded from decay."""
    from transformers import create_optimizer as transformers_optimizer

    return transformers_optimizer(
        init_lr=settings.learning_rate,
        num_train_steps=total_steps,
        num_warmup_steps=int(settings.warmup_fraction * total_steps),
        weight_decay_rate=settings.weight_decay,
    )


def train_function(
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
