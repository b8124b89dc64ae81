"""The masked-LM objective and its metrics, computed the same way in training, validation and evaluation.

The LM head runs only at the masked positions of each sample (at most ``max_predictions`` of them): its
vocabulary-wide projection is the largest matmul of a small model, and at 15% masking this skips most of it.
Positions are gathered with ``top_k`` so shapes stay static for XLA. Every function works on one replica's
batch inside ``strategy.run``, so the same code serves one CPU and the 8 replicas of a TPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from components.lib.errors import InvalidParameter

SUMS = 6  # what each replica adds up of a batch (MaskedLMScorer)
# The evaluate step's batch, and how many it scores by default: 9,600 samples, few enough that roberta-base scores
# them in minutes on the step's CPUs (the whole validation set of a 20 GB corpus would take days there:
# docs/big-corpora.md), with the loss's standard error over them reported beside it.
EVALUATION_BATCH_SIZE = 64
EVALUATION_MAX_BATCHES = 150


def check_probability(value: float, parameter: str = "mlm_probability") -> None:
    if not 0.0 < value < 1.0:
        raise InvalidParameter(parameter, value, "must be between 0 and 1 (0.15 is usual)")


def max_predictions(max_length: int, probability: float) -> int:
    """A static bound on the masked tokens of one sample: the mean plus six standard deviations, so that a
    sample with more (odds below one in a hundred million) practically never occurs."""
    mean = max_length * probability
    return min(max_length, math.ceil(mean + 6 * math.sqrt(mean * (1 - probability))) + 1)


def masked_logits(model: Any, batch: dict[str, Any], predictions: int, training: bool) -> tuple[Any, Any, Any]:
    """(fp32 logits, target ids, weights) at the first ``predictions`` masked positions of each sample; the
    weight is 0 where a sample has fewer masked tokens than that."""
    import tensorflow as tf

    encoder = getattr(model, model.base_model_prefix)
    hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training)[0]
    labels = batch["labels"]
    masked = tf.cast(labels >= 0, tf.float32)
    _, positions = tf.math.top_k(masked, k=predictions)  # the masked positions come first
    weights = tf.gather(masked, positions, batch_dims=1)
    targets = tf.gather(tf.maximum(labels, 0), positions, batch_dims=1)
    logits = model.get_lm_head()(tf.gather(hidden, positions, batch_dims=1), training=training)
    return tf.cast(logits, tf.float32), targets, weights


def masked_lm_loss(model: Any, batch: dict[str, Any], predictions: int, training: bool = True) -> Any:
    """Mean cross-entropy over the masked tokens: the loss transformers computes from the full logits."""
    import tensorflow as tf

    logits, targets, weights = masked_logits(model, batch, predictions, training)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    return tf.reduce_sum(losses * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)


def sample_losses(model: Any, batch: dict[str, Any], predictions: int) -> tuple[Any, Any, Any]:
    """Each sample's summed masked-token loss, its masked tokens and the tokens predicted right. The cross-entropy
    without the softmax's probabilities, which only a gradient needs: the vocabulary-wide softmax is what a small
    model's evaluation spends most of its time on."""
    import tensorflow as tf

    logits, targets, weights = masked_logits(model, batch, predictions, training=False)
    losses = tf.reduce_logsumexp(logits, axis=-1) - tf.gather(logits, targets, batch_dims=2)
    correct = tf.cast(tf.argmax(logits, axis=-1, output_type=targets.dtype) == targets, tf.float32)
    return tf.reduce_sum(losses * weights, 1), tf.reduce_sum(weights, 1), tf.reduce_sum(correct * weights, 1)


def ratio_standard_error(
    values: float, tokens: float, value_squares: float, value_by_tokens: float, token_squares: float, samples: float
) -> float:
    """The standard error of values / tokens, a ratio of two sums over samples, from the sums of each sample's value
    and tokens, squared and crossed: by the delta method, each sample's departure from the ratio,
    sum((v_i - r t_i)^2) / tokens^2, and n / (n - 1) for the mean's own estimate; NaN for one sample."""
    ratio = values / tokens
    spread = max(value_squares - 2 * ratio * value_by_tokens + ratio**2 * token_squares, 0.0)
    return math.sqrt(spread * samples / (samples - 1)) / tokens if samples > 1 else math.nan


class MaskedLMScorer:
    """Loss, perplexity and masked-token accuracy over a dataset of global batches.

    The whole pass runs in one graph function, traced once and reused at every call (validating at each
    checkpoint does not compile again; on a TPU a recompile costs minutes), with no return to Python
    between batches. Each replica returns sums, which are added across replicas, so any replica count gives
    the same figures up to float rounding. The sums include each sample's loss and masked tokens squared and
    crossed, for the loss's standard error over the samples scored (``loss_standard_error``): how precise a loss
    from a part of a validation set is."""

    def __init__(self, model: Any, strategy: Any, predictions: int):
        import tensorflow as tf

        self._strategy = strategy

        def replica_sums(batch: dict[str, Any]) -> tuple[Any, ...]:
            samples = tf.shape(batch["input_ids"])[0]

            def scored() -> tuple[Any, ...]:
                sample_loss, sample_tokens, correct = sample_losses(model, batch, predictions)
                return (
                    tf.reduce_sum(sample_loss),
                    tf.reduce_sum(sample_tokens),
                    tf.reduce_sum(correct),
                    tf.reduce_sum(sample_loss**2),
                    tf.reduce_sum(sample_loss * sample_tokens),
                    tf.reduce_sum(sample_tokens**2),
                )

            # a replica's share of a short last batch can be empty, which the encoder's reshapes do not take
            sums = tf.cond(samples > 0, scored, lambda: tuple(tf.constant(0.0) for _ in range(SUMS)))
            return (*sums, tf.cast(samples, tf.float32))

        @tf.function
        def score(dataset: Any) -> Any:
            # loss, masked tokens, correct, the three sums of squares, samples, batches
            totals = tf.zeros([SUMS + 2], tf.float64)
            for batch in dataset:
                sums = strategy.run(replica_sums, args=(batch,))
                reduced = [tf.cast(strategy.reduce("SUM", value, axis=None), tf.float64) for value in sums]
                totals += tf.stack([*reduced, tf.constant(1.0, tf.float64)])
            return totals

        self._score = score

    def __call__(self, stream: Callable[..., Any], max_batches: int | None = None) -> dict[str, Any]:
        """Scores the batches ``stream(input_context, max_batches=...)`` gives on each input pipeline (one a
        host; ``input_pipeline.evaluation_dataset`` with its settings bound), at most ``max_batches`` global batches."""
        from components.lib.input_pipeline import distributed

        make = functools.partial(stream, max_batches=max_batches)
        totals = self._score(distributed(self._strategy, make)).numpy()
        loss_sum, tokens, correct, loss_squares, loss_by_tokens, token_squares, samples, batches = totals
        if tokens == 0:
            raise InvalidParameter("shards", "(evaluation set)", "no token was masked; the evaluation set is empty")
        loss = loss_sum / tokens
        standard_error = ratio_standard_error(loss_sum, tokens, loss_squares, loss_by_tokens, token_squares, samples)
        return {
            "loss": float(loss),
            "loss_standard_error": float(standard_error),
            "perplexity": math.exp(min(loss, 700.0)),
            "masked_accuracy": float(correct / tokens),
            "masked_tokens": int(tokens),
            "samples": int(samples),
            "batches": int(batches),
        }

    @property
    def traces(self) -> int:
        """How many times the pass was traced (compiled): 1 however often it runs on batches of one shape."""
        return self._score.experimental_get_tracing_count()


def unigram_perplexity(dataset: Any, token_counts: list[int]) -> float:
    """The perplexity of predicting each masked token of ``dataset`` by its frequency in ``token_counts`` (the
    training shards', add-one smoothed): what a model scores that has learned word frequencies and nothing
    else, the baseline a trained model's perplexity is worth comparing with."""
    import numpy as np

    counts = np.asarray(token_counts, dtype=np.float64) + 1.0
    log_probabilities = np.log(counts / counts.sum())
    negative_log_likelihood, masked = 0.0, 0
    for batch in dataset.as_numpy_iterator():
        targets = batch["labels"][batch["labels"] >= 0]
        negative_log_likelihood -= float(log_probabilities[targets].sum())
        masked += targets.size
    return math.exp(min(negative_log_likelihood / masked, 700.0)) if masked else math.nan
