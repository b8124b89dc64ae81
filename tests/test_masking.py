import numpy as np
import pytest
import tensorflow as tf

from components.lib.masking import IGNORE_INDEX, Masking, masked_dataset
from components.lib.shard_set import read_manifest


def collect(shards: str, seed: int, probability: float = 0.15):
    manifest = read_manifest(shards)
    masking = Masking.from_manifest(manifest, probability)
    dataset = masked_dataset(shards, manifest, 64, masking, training=False, seed=seed)
    original = np.concatenate(
        [
            b.numpy()
            for b in tf.data.TFRecordDataset([f"{shards}/{f['name']}" for f in manifest["files"]])
            .batch(64)
            .map(lambda r: tf.io.parse_example(r, {"input_ids": tf.io.FixedLenFeature([128], tf.int64)})["input_ids"])
        ]
    )
    batches = list(dataset)
    masked = np.concatenate([b["input_ids"].numpy() for b in batches])
    labels = np.concatenate([b["labels"].numpy() for b in batches])
    return manifest, original, masked, labels


def test_masking_statistics_on_real_shards(wikitext_shards):
    manifest, original, masked, labels = collect(wikitext_shards["validation"], seed=0)
    special = np.isin(original, list(set(manifest["special_tokens"].values())))
    chosen = labels != IGNORE_INDEX
    assert not (chosen & special).any(), "a special token was chosen for masking"
    assert (masked[special] == original[special]).all()
    assert (labels[chosen] == original[chosen]).all()
    assert (masked[~chosen] == original[~chosen]).all()

    rate = chosen.sum() / (~special).sum()
    assert rate == pytest.approx(0.15, abs=0.005)
    became_mask = (masked[chosen] == manifest["special_tokens"]["mask"]).mean()
    kept = (masked[chosen] == original[chosen]).mean()
    replaced = 1 - became_mask - kept
    assert became_mask == pytest.approx(0.8, abs=0.01)
    assert replaced == pytest.approx(0.1, abs=0.01)
    assert kept == pytest.approx(0.1, abs=0.01)  # includes the rare random draw of the same token
    assert chosen.sum() > 10_000


def test_masking_is_reproducible_for_a_seed_and_differs_across_seeds(wikitext_shards):
    _, _, masked_a, labels_a = collect(wikitext_shards["validation"], seed=7)
    _, _, masked_b, labels_b = collect(wikitext_shards["validation"], seed=7)
    _, _, masked_c, _ = collect(wikitext_shards["validation"], seed=8)
    assert np.array_equal(masked_a, masked_b) and np.array_equal(labels_a, labels_b)
    assert not np.array_equal(masked_a, masked_c)


def test_training_stream_repeats_shuffles_and_keeps_full_batches(wikitext_shards):
    manifest = read_manifest(wikitext_shards["validation"])
    masking = Masking.from_manifest(manifest)
    dataset = masked_dataset(
        wikitext_shards["validation"], manifest, 48, masking, training=True, seed=1, shuffle_buffer=500
    )
    batches = [b["input_ids"].numpy() for b in dataset.take(2 * manifest["num_records"] // 48 + 3)]
    assert all(b.shape == (48, 128) for b in batches)
    first_epoch = np.concatenate(batches)[: manifest["num_records"]]
    _, original, _, _ = collect(wikitext_shards["validation"], seed=0)
    assert not np.array_equal(first_epoch[:, :1], original[: len(first_epoch), :1])  # shuffled


def test_the_training_stream_is_the_same_in_every_run_for_a_seed(wikitext_shards):
    """What a seed promises: the same batches, masked the same, from shards read by parallel readers; with
    tf.data's autotuning off (its thread held every finished job for up to a minute) as it would be with it on."""
    manifest = read_manifest(wikitext_shards["train"])
    assert len(manifest["files"]) >= 3

    def stream(seed: int, autotune: bool = False) -> list[np.ndarray]:
        dataset = masked_dataset(
            wikitext_shards["train"], manifest, 32, Masking.from_manifest(manifest), training=True, seed=seed
        )
        assert dataset.options().autotune.enabled is False
        if autotune:
            options = tf.data.Options()
            options.autotune.enabled = True
            dataset = dataset.with_options(options)
        return [np.concatenate([b["input_ids"].numpy(), b["labels"].numpy()]) for b in dataset.take(40)]

    first, again, autotuned, other = stream(3), stream(3), stream(3, autotune=True), stream(4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(first, autotuned, strict=True))
    assert not np.array_equal(first[0], other[0])


def test_batches_reach_the_device_as_int32(wikitext_shards):
    """A TPU has no 64-bit integer arithmetic: what the model gets is int32, from the shards' int64 features."""
    manifest = read_manifest(wikitext_shards["validation"])
    dataset = masked_dataset(
        wikitext_shards["validation"], manifest, 8, Masking.from_manifest(manifest), training=False
    )
    assert {name: spec.dtype for name, spec in dataset.element_spec.items()} == {
        "input_ids": tf.int32,
        "attention_mask": tf.int32,
        "labels": tf.int32,
    }
