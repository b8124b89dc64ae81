"""Streaming shards into training and evaluation: ``tf.data`` from the manifest, masking inside the graph.

The pipeline reads the files a manifest lists (local or ``gs://``), in shuffled file order with parallel
interleaved reads, shuffles samples, batches, parses a whole batch with one ``tf.io.parse_example`` call
and masks it with stateless random ops. Everything runs inside the ``tf.data`` graph, so nothing waits on
Python and the model step compiles with XLA on TPU.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.records import feature_spec

IGNORE_INDEX = -100  # the label transformers' loss skips
# Validation in training and the evaluate step mask this share, whatever the training's masking: a loss measured
# at another rate cannot be compared (a model trained at 30% and scored on 30% masks has a harder task).
EVALUATION_MLM_PROBABILITY = 0.15


@dataclass(frozen=True)
class Masking:
    """BERT/RoBERTa masking: ``probability`` of the maskable tokens are chosen; of those, 80% become
    ``<mask>``, 10% a random token and 10% stay as they are. Special and padding tokens are never chosen.
    With ``final_probability``, the share moves linearly from ``probability`` at batch 0 to it at batch
    ``decay_batches``; ``first_batch`` is where a resumed stream starts, so the decay goes on where it was."""

    mask_token_id: int
    vocab_size: int
    special_token_ids: tuple[int, ...]
    probability: float = EVALUATION_MLM_PROBABILITY
    final_probability: float = 0.0  # 0: constant
    decay_batches: int = 0
    first_batch: int = 0

    @classmethod
    def from_manifest(
        cls, manifest: dict[str, Any], probability: float = EVALUATION_MLM_PROBABILITY, **decay: Any
    ) -> Masking:
        special = manifest["special_tokens"]
        ids = tuple(sorted({value for value in special.values() if value is not None}))
        return cls(special["mask"], manifest["vocab_size"], ids, probability, **decay)

    def rate(self, batch_index: Any) -> Any:
        """The share of tokens masked in the batch ``batch_index`` of this stream."""
        import tensorflow as tf

        if not self.final_probability or not self.decay_batches:
            return tf.constant(self.probability, tf.float32)
        done = tf.cast(self.first_batch + batch_index, tf.float32) / self.decay_batches
        return self.probability + (self.final_probability - self.probability) * tf.minimum(done, 1.0)


def mask_tokens(batch: dict[str, Any], seed: Any, masking: Masking, batch_index: Any = 0) -> dict[str, Any]:
    """Masks a parsed batch, the ``batch_index``-th of its stream; ``seed`` (two int64) makes the result
    reproducible. Adds ``labels``: the original id where a token was chosen, -100 elsewhere. Every tensor leaves
    as int32, what TPUs take (TFRecord features are int64; a TPU has no 64-bit integer arithmetic)."""
    import tensorflow as tf

    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    shape = tf.shape(input_ids)
    choose_seed, action_seed, random_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    special = tf.reduce_any(input_ids[..., None] == tf.constant(masking.special_token_ids, tf.int64), axis=-1)
    maskable = ~special & (attention_mask == 1)
    chosen = maskable & (tf.random.stateless_uniform(shape, choose_seed) < masking.rate(batch_index))
    action = tf.random.stateless_uniform(shape, action_seed)
    random_ids = tf.random.stateless_uniform(shape, random_seed, 0, masking.vocab_size, dtype=tf.int64)
    masked = tf.where(chosen & (action < 0.8), tf.constant(masking.mask_token_id, tf.int64), input_ids)
    masked = tf.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, masked)
    labels = tf.where(chosen, input_ids, tf.constant(IGNORE_INDEX, tf.int64))
    return {
        name: tf.cast(value, tf.int32)
        for name, value in (("input_ids", masked), ("attention_mask", attention_mask), ("labels", labels))
    }


def shard_files(uri: str, manifest: dict[str, Any]) -> list[str]:
    return [storage.join(uri, file["name"]) for file in manifest["files"]]


def masked_dataset(
    uri: str,
    manifest: dict[str, Any],
    batch_size: int,
    masking: Masking,
    *,
    training: bool,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
    parallel_reads: int = 16,
    drop_remainder: bool | None = None,
) -> Any:
    """Batches of masked samples from the shard folder ``uri``.

    Training: file order shuffled, samples shuffled, repeated forever, full batches only, the same batches in
    every run for the same seed (parallel reads keep their order: a seed means a reproducible run). Evaluation: one
    deterministic pass, the last batch short unless ``drop_remainder`` (TPUs need full batches), each sample
    masked from its own index and the seed: the same positions in every run, whatever the batch size."""
    import tensorflow as tf

    autotune = tf.data.AUTOTUNE
    files = shard_files(uri, manifest)
    spec = feature_spec(manifest["max_length"])
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if training:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
    dataset = dataset.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=1 << 20),
        cycle_length=min(parallel_reads, len(files)),
        num_parallel_calls=autotune,
        deterministic=True,
    )
    seed_tensor = tf.constant(seed, tf.int64)
    if not training:
        dataset = dataset.enumerate()  # each sample's index, which seeds its masks
        dataset = dataset.batch(batch_size, drop_remainder=bool(drop_remainder))
        dataset = dataset.map(
            lambda indices, records: _mask_each(tf.io.parse_example(records, spec), seed_tensor, indices, masking),
            num_parallel_calls=autotune,
            deterministic=True,
        )
        return _without_autotuning(dataset.prefetch(autotune))
    dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.batch(batch_size, drop_remainder=True if drop_remainder is None else drop_remainder)
    dataset = dataset.map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=autotune)
    dataset = dataset.enumerate().map(
        lambda index, batch: mask_tokens(batch, tf.stack([seed_tensor, index]), masking, index),
        num_parallel_calls=autotune,
        deterministic=True,
    )
    return _without_autotuning(dataset.prefetch(autotune))


def _stream_iterator(strategy: Any, dataset: Any) -> Any:
    """The training stream's iterator: the dataset's own on one CPU or GPU replica, the strategy's distributed one
    elsewhere. The distributed iterator prefetches through per-device datasets of TensorFlow's own, autotuned
    whatever the stream's options, and deleting it waits for their autotuning threads: up to 48 s measured at the
    end of a run, on one CPU replica."""
    import tensorflow as tf

    if strategy.num_replicas_in_sync == 1 and not isinstance(strategy, tf.distribute.TPUStrategy):
        return iter(dataset)
    return iter(strategy.experimental_distribute_dataset(dataset))


def _without_autotuning(dataset: Any) -> Any:
    """The dataset with tf.data's autotuning off: its AUTOTUNE parallelism becomes the machine's core count and
    its prefetch buffers grow on their own. Deleting an autotuned iterator joins its autotuning thread
    ("tf_data_model"), which held the end of the train step for up to a minute (docs/benchmarks.md)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _mask_each(batch: dict[str, Any], seed: Any, indices: Any, masking: Masking) -> dict[str, Any]:
    """Masks each sample of a batch from ``(seed, its index)``."""
    import tensorflow as tf

    length = batch["input_ids"].shape[-1]
    return tf.map_fn(
        lambda sample: mask_tokens(sample[0], tf.stack([seed, sample[1]]), masking),
        (batch, indices),
        fn_output_signature={
            name: tf.TensorSpec([length], tf.int32) for name in ("input_ids", "attention_mask", "labels")
        },
    )


def first_corrupt_shard(uri: str, manifest: dict[str, Any]) -> tuple[str, str] | None:
    """(name, TensorFlow's message) of the first shard whose records fail their checksums, or None. Reads
    every record: used once reading has failed, to say which file it was (``DataLossError`` does not)."""
    import tensorflow as tf

    for path in shard_files(uri, manifest):
        try:
            for _ in tf.data.TFRecordDataset(path):
                pass
        except tf.errors.DataLossError as error:
            # "{{function_node ...}} corrupted record at 150288 [Op:IteratorGetNext] name: " -> the middle
            return storage.basename(path), re.sub(r"\{\{.*?\}\}|\[Op:.*", "", error.message).strip()
    return None


@contextlib.contextmanager
def naming_corrupt_shards(*sources: tuple[str, str, dict[str, Any] | None]) -> Iterator[None]:
    """Turns a ``DataLossError`` raised inside into an error naming the parameter, the folder and the shard
    that is corrupted, looked for in ``sources``: (parameter, folder, manifest) triples."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.DataLossError:
        for parameter, uri, manifest in sources:
            found = first_corrupt_shard(uri, manifest) if manifest is not None else None
            if found is not None:
                name, message = found
                raise InvalidParameter(
                    parameter, uri, f"shard {name} is corrupted ({message}); write the shards again"
                ) from None
        raise


def training_streams(settings: Any, plan: Any, strategy: Any, start_step: int) -> tuple[Any, Any, Masking]:
    """The train step's inputs: the distributed training stream of micro-batches, its shuffle seeded anew for a
    resumed run and its masking rate going on where it was, and the validation shards' full batches masked at
    the fixed evaluation rate (None without validation shards), and the training's masking."""
    masking = Masking.from_manifest(
        plan.manifest,
        settings.mlm_probability,
        final_probability=settings.final_mlm_probability,
        decay_batches=plan.total_steps * plan.accumulation,
        first_batch=start_step * plan.accumulation,
    )
    dataset = masked_dataset(
        settings.train_shards,
        plan.manifest,
        plan.micro_batch_size,
        masking,
        training=True,
        seed=settings.seed + start_step,
        shuffle_buffer=settings.shuffle_buffer,
    )
    iterator = _stream_iterator(strategy, dataset)
    if plan.eval_manifest is None:
        return iterator, None, masking
    batches = masked_dataset(
        settings.eval_shards,
        plan.eval_manifest,
        plan.micro_batch_size,
        Masking.from_manifest(plan.eval_manifest),  # EVALUATION_MLM_PROBABILITY, seed 0: the same masks each time
        training=False,
        drop_remainder=True,  # TPUs need full batches
    )
    return iterator, batches, masking
