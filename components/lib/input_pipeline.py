"""Streaming shards into training and evaluation: ``tf.data`` from the manifest, masking inside the graph.

The pipeline reads the files a manifest lists (local or ``gs://``), in shuffled file order with parallel
interleaved reads, shuffles samples, batches, parses a whole batch with one ``tf.io.parse_example`` call
and masks it with stateless random ops. Everything runs inside the ``tf.data`` graph, so nothing waits on
Python and the model step compiles with XLA on TPU.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import random
import re
from collections.abc import Callable, Iterator
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
    ``<mask>``, 10% a random ordinary token (never a special one, as fairseq draws them: a ``<pad>`` mid-row would
    shift the position ids TF RoBERTa counts over non-pad tokens) and 10% stay as they are. Special and padding
    tokens are never chosen.
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
    ordinary = sorted(set(range(masking.vocab_size)) - set(masking.special_token_ids))
    drawn = tf.random.stateless_uniform(shape, random_seed, 0, len(ordinary), dtype=tf.int64)
    random_ids = tf.gather(tf.constant(ordinary, tf.int64), drawn)
    masked = tf.where(chosen & (action < 0.8), tf.constant(masking.mask_token_id, tf.int64), input_ids)
    masked = tf.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, masked)
    labels = tf.where(chosen, input_ids, tf.constant(IGNORE_INDEX, tf.int64))
    return {
        name: tf.cast(value, tf.int32)
        for name, value in (("input_ids", masked), ("attention_mask", attention_mask), ("labels", labels))
    }


def shard_files(uri: str, manifest: dict[str, Any]) -> list[str]:
    return [storage.join(uri, file["name"]) for file in manifest["files"]]


def input_share(files: list[Any], pipelines: int, pipeline: int, seed: int) -> list[Any]:
    """The shard files input pipeline ``pipeline`` of ``pipelines`` reads (one pipeline a host): every
    ``pipelines``-th of the list shuffled with ``seed``, which every pipeline is given, so the shares are disjoint
    and together the whole set, and a host's share does not follow the files' order (a corpus written in
    order would give each host its own topics). One pipeline reads the list as it is."""
    if pipelines == 1:
        return list(files)
    if len(files) < pipelines:
        raise InvalidParameter("shards", f"{len(files)} file(s)", f"fewer than the {pipelines} input pipelines")
    return random.Random(seed).sample(files, len(files))[pipeline::pipelines]


@dataclass(frozen=True)
class _Layout:
    """What an input pipeline reads of a shard set and how it batches: its files, each with the place of its
    first record in the whole set (which seeds evaluation's masks) and its record count; its place among the
    pipelines (one a host); its per-replica batch and the replicas it feeds."""

    files: list[tuple[str, int, int]]
    pipelines: int
    pipeline: int
    per_replica: int
    replicas_here: int


def _layout(uri: str, manifest: dict[str, Any], batch_size: int, input_context: Any) -> _Layout:
    import tensorflow as tf

    context = input_context or tf.distribute.InputContext()
    records = [file["records"] for file in manifest["files"]]
    firsts = [0, *itertools.accumulate(records)][:-1]
    return _Layout(
        list(zip(shard_files(uri, manifest), firsts, records, strict=True)),
        context.num_input_pipelines,
        context.input_pipeline_id,
        context.get_per_replica_batch_size(batch_size),
        context.num_replicas_in_sync // context.num_input_pipelines,
    )


def training_dataset(
    uri: str,
    manifest: dict[str, Any],
    batch_size: int,
    masking: Masking,
    input_context: Any = None,
    *,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
    parallel_reads: int = 16,
) -> Any:
    """Batches of masked training samples from the shard folder ``uri``, ``batch_size`` samples across the
    replicas, forever.

    ``input_context`` (a ``tf.distribute.InputContext``; none: one pipeline, one replica) says which input
    pipeline this is, one a host: it reads its share of the files (``input_share``) and batches at the
    per-replica size, its replicas taking consecutive batches. File order shuffled, samples shuffled, repeated,
    full batches only, the same batches in every run for the same seed (parallel reads keep their order: a seed
    means a reproducible run), each pipeline masking with seeds of its own, at the rate of the micro-step each
    batch is trained at."""
    import tensorflow as tf

    layout = _layout(uri, manifest, batch_size, input_context)
    paths = [path for path, _, _ in input_share(layout.files, layout.pipelines, layout.pipeline, seed)]
    autotune = tf.data.AUTOTUNE
    seed_tensor = tf.constant(seed, tf.int64)
    spec = feature_spec(manifest["max_length"])
    dataset = tf.data.Dataset.from_tensor_slices(paths)
    dataset = dataset.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True).repeat()
    dataset = dataset.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=1 << 20),
        cycle_length=min(parallel_reads, len(paths)),
        num_parallel_calls=autotune,
        deterministic=True,
    )
    dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.batch(layout.per_replica, drop_remainder=True)
    dataset = dataset.map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=autotune)

    def mask(index: Any, batch: dict[str, Any]) -> dict[str, Any]:
        # the pipeline's index-th batch: a seed no other pipeline's batch has, and the micro-step it is
        # trained at, which the masking rate's decay follows (the replicas here take consecutive batches)
        batch_seed = tf.stack([seed_tensor, index * layout.pipelines + layout.pipeline])
        return mask_tokens(batch, batch_seed, masking, index // layout.replicas_here)

    dataset = dataset.enumerate().map(mask, num_parallel_calls=autotune, deterministic=True)
    return _without_autotuning(dataset.prefetch(autotune))


def evaluation_dataset(
    uri: str,
    manifest: dict[str, Any],
    batch_size: int,
    masking: Masking,
    input_context: Any = None,
    *,
    seed: int = 0,
    parallel_reads: int = 16,
    drop_remainder: bool = False,
    max_batches: int | None = None,
) -> Any:
    """One deterministic pass of masked samples over the shard folder ``uri``, ``batch_size`` samples across
    the replicas.

    ``input_context`` as for ``training_dataset``; on several pipelines each reads its share of the records
    (every host reads every file and keeps every n-th record). The last batch is short unless
    ``drop_remainder`` (TPUs need full batches; then every pipeline gives as many as the pipeline with the
    fewest); at most ``max_batches`` global batches; each sample masked from the seed and its place in the set
    (file and record): a sample's masks are the same in every run, whatever the batch size or the number of
    pipelines (which samples a pass covers depends on them)."""
    import tensorflow as tf

    layout = _layout(uri, manifest, batch_size, input_context)
    autotune = tf.data.AUTOTUNE
    seed_tensor = tf.constant(seed, tf.int64)
    spec = feature_spec(manifest["max_length"])
    paths, firsts, records = (list(column) for column in zip(*layout.files, strict=True))
    # the files in an order that spreads the first read over the whole set: a pass cut at max_batches scores samples
    # from across the hold-out, not the first parts' files only (a sample's masks follow its place, not the order)
    order = spread_order(len(paths))
    paths, firsts = [paths[i] for i in order], [firsts[i] for i in order]
    if drop_remainder and layout.pipelines > 1:
        # every host the same number of full batches: a host that ran out would be given empty batches, of
        # another shape than the others' (a TPU compiles the step again for it)
        steps = (
            sum(records) // layout.pipelines // layout.per_replica // layout.replicas_here
        )  # the fewest any host has
        max_batches = steps if max_batches is None else min(max_batches, steps)
    dataset = tf.data.Dataset.from_tensor_slices((paths, tf.constant(firsts, tf.int64)))
    dataset = dataset.interleave(
        lambda path, first: tf.data.TFRecordDataset(path, buffer_size=1 << 20).enumerate(first),
        cycle_length=min(parallel_reads, len(paths)),
        num_parallel_calls=autotune,
        deterministic=True,
    )
    if layout.pipelines > 1:
        # each host reads every file and keeps every pipelines-th record, so that every host has as many samples,
        # give or take one, whatever the files' sizes (a host short of one batch would stop the run)
        dataset = dataset.shard(layout.pipelines, layout.pipeline)
    dataset = dataset.batch(layout.per_replica, drop_remainder=drop_remainder)
    if max_batches is not None:
        dataset = dataset.take(max_batches * layout.replicas_here)
    dataset = dataset.map(
        lambda places, records: _mask_each(tf.io.parse_example(records, spec), seed_tensor, places, masking),
        num_parallel_calls=autotune,
        deterministic=True,
    )
    return _without_autotuning(dataset.prefetch(autotune))


def spread_order(count: int) -> list[int]:
    """0 to ``count - 1`` in the order of their bit-reversed binary fractions (0, 1/2, 1/4, 3/4, ...): every first
    few of them spread evenly over the whole range."""
    width = max(count - 1, 1).bit_length()
    return sorted(range(count), key=lambda index: int(f"{index:0{width}b}"[::-1], 2))


def input_pipelines(strategy: Any) -> int:
    """How many input pipelines ``distribute_datasets_from_function`` makes for ``strategy``: one a host (a
    worker task its devices are on)."""
    return len({device.split("/device:")[0] for device in strategy.extended.worker_devices})


def distributed(strategy: Any, make: Callable[[Any], Any]) -> Any:
    """The stream ``make(input_context)`` gives on each input pipeline, one a host, spread over the replicas
    (``distribute_datasets_from_function``); on one CPU or GPU replica, the dataset itself. The distributed
    iterator prefetches through per-device datasets of TensorFlow's own, autotuned whatever the stream's options,
    and deleting it waits for their autotuning threads: up to 48 s measured at the end of a run, on one CPU
    replica. (TPUStrategy takes no other replication mode than one pipeline a host.)"""
    import tensorflow as tf

    if strategy.num_replicas_in_sync == 1 and not isinstance(strategy, tf.distribute.TPUStrategy):
        return make(tf.distribute.InputContext())
    return strategy.distribute_datasets_from_function(make)


def _without_autotuning(dataset: Any) -> Any:
    """The dataset with tf.data's autotuning off: its AUTOTUNE parallelism becomes the machine's core count and
    its prefetch buffers grow on their own. Deleting an autotuned iterator joins its autotuning thread
    ("tf_data_model"), which held the end of the train step for up to a minute (docs/benchmarks.md)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _mask_each(batch: dict[str, Any], seed: Any, places: Any, masking: Masking) -> dict[str, Any]:
    """Masks each sample of a batch from ``(seed, its place in the set)``."""
    import tensorflow as tf

    length = batch["input_ids"].shape[-1]
    return tf.map_fn(
        lambda sample: mask_tokens(sample[0], tf.stack([seed, sample[1]]), masking),
        (batch, places),
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
    resumed run and its masking rate going on where it was; the validation: a function of the most batches that
    gives the validation shards' full batches masked at the fixed evaluation rate, for ``MaskedLMScorer`` (None
    without validation shards); and the training's masking."""
    masking = Masking.from_manifest(
        plan.manifest,
        settings.mlm_probability,
        final_probability=settings.final_mlm_probability,
        decay_batches=plan.shape.micro_batches_before(plan.total_steps),
        first_batch=plan.shape.micro_batches_before(start_step),
    )
    stream = functools.partial(
        training_dataset,
        settings.train_shards,
        plan.manifest,
        plan.micro_batch_size,
        masking,
        seed=settings.seed + start_step,
        shuffle_buffer=settings.shuffle_buffer,
    )
    iterator = iter(distributed(strategy, stream))
    if plan.eval_manifest is None:
        return iterator, None, masking
    validation = functools.partial(
        evaluation_dataset,
        settings.eval_shards,
        plan.eval_manifest,
        plan.micro_batch_size,
        Masking.from_manifest(plan.eval_manifest),  # EVALUATION_MLM_PROBABILITY, seed 0: the same masks each time
        drop_remainder=True,  # TPUs need full batches
    )
    return iterator, validation, masking
