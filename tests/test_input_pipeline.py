import itertools

import numpy as np
import pytest
import tensorflow as tf

from components.lib.input_pipeline import (
    IGNORE_INDEX,
    Masking,
    evaluation_dataset,
    input_share,
    mask_tokens,
    shard_files,
    spread_order,
    training_dataset,
)
from components.lib.shard_set import read_manifest


def collect(shards: str, seed: int, probability: float = 0.15):
    manifest = read_manifest(shards)
    masking = Masking.from_manifest(manifest, probability)
    dataset = evaluation_dataset(shards, manifest, 64, masking, seed=seed)
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
    # four seeds' masks of the same samples: enough draws to tell a share off by a point from chance
    seeds = [collect(wikitext_shards["validation"], seed=seed) for seed in range(4)]
    manifests, originals, maskings, seeds_labels = zip(*seeds, strict=True)
    manifest = manifests[0]
    original, masked, labels = np.concatenate(originals), np.concatenate(maskings), np.concatenate(seeds_labels)
    special = np.isin(original, list(set(manifest["special_tokens"].values())))
    chosen = labels != IGNORE_INDEX
    assert not (chosen & special).any(), "a special token was chosen for masking"
    assert (masked[special] == original[special]).all()
    assert (labels[chosen] == original[chosen]).all()
    assert (masked[~chosen] == original[~chosen]).all()

    assert chosen.sum() > 40_000
    near(chosen.sum() / (~special).sum(), 0.15, (~special).sum())
    became_mask = (masked[chosen] == manifest["special_tokens"]["mask"]).mean()
    kept = (masked[chosen] == original[chosen]).mean()
    near(became_mask, 0.8, chosen.sum())
    near(1 - became_mask - kept, 0.1, chosen.sum())
    near(kept, 0.1, chosen.sum())  # includes the rare random draw of the same token


def near(share: float, expected: float, draws: int) -> None:
    """``share`` of ``draws`` is ``expected`` within 4 of its standard errors (a correct masking fails one check in
    16,000, the test's four about one run in 4,000). The shards (their tokenizer is not reproducible) and so the
    masks differ from run to run: bounds fixed in points (the 80% within 0.01 of one seed's 12,900 draws: 2.8
    standard errors) failed a correct masking about once in 200 runs."""
    error = 4 * np.sqrt(expected * (1 - expected) / draws)
    assert abs(share - expected) <= error, f"{share:.4f} of {draws} draws, {expected} expected within {error:.4f}"


def test_masking_is_reproducible_for_a_seed_and_differs_across_seeds(wikitext_shards):
    _, _, masked_a, labels_a = collect(wikitext_shards["validation"], seed=7)
    _, _, masked_b, labels_b = collect(wikitext_shards["validation"], seed=7)
    _, _, masked_c, _ = collect(wikitext_shards["validation"], seed=8)
    assert np.array_equal(masked_a, masked_b) and np.array_equal(labels_a, labels_b)
    assert not np.array_equal(masked_a, masked_c)


def test_training_stream_repeats_shuffles_and_keeps_full_batches(wikitext_shards):
    manifest = read_manifest(wikitext_shards["validation"])
    masking = Masking.from_manifest(manifest)
    dataset = training_dataset(wikitext_shards["validation"], manifest, 48, masking, seed=1, shuffle_buffer=500)
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
        dataset = training_dataset(wikitext_shards["train"], manifest, 32, Masking.from_manifest(manifest), seed=seed)
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
    dataset = evaluation_dataset(wikitext_shards["validation"], manifest, 8, Masking.from_manifest(manifest))
    assert {name: spec.dtype for name, spec in dataset.element_spec.items()} == {
        "input_ids": tf.int32,
        "attention_mask": tf.int32,
        "labels": tf.int32,
    }


def test_random_replacements_are_never_special_tokens():
    """Of a vocabulary of ten pieces, five special: a draw from the whole vocabulary would make half the random
    replacements special (a <pad> mid-row shifts RoBERTa's positions); every one is an ordinary piece, and every
    ordinary piece is drawn."""
    masking = Masking(mask_token_id=4, vocab_size=10, special_token_ids=(0, 1, 2, 3, 4), probability=0.5)
    ids = tf.constant(np.random.default_rng(0).integers(5, 10, size=(64, 128)), tf.int64)
    replaced = []
    for index in range(20):
        batch = mask_tokens(
            {"input_ids": ids, "attention_mask": tf.ones_like(ids)}, tf.constant([7, index], tf.int64), masking
        )
        labels, masked = batch["labels"].numpy(), batch["input_ids"].numpy()
        replaced.append(masked[(labels >= 0) & (masked != 4)])  # replaced at random, or kept as it was
    replaced = np.concatenate(replaced)
    assert len(replaced) > 10_000 and set(np.unique(replaced)) == {5, 6, 7, 8, 9}


def contexts(pipelines: int, replicas_each: int = 2) -> list[tf.distribute.InputContext]:
    """The input contexts of a slice of ``pipelines`` hosts with ``replicas_each`` replicas each, as
    ``distribute_datasets_from_function`` makes them."""
    return [tf.distribute.InputContext(pipelines, host, pipelines * replicas_each) for host in range(pipelines)]


@pytest.mark.parametrize("pipelines", [2, 4])
def test_each_host_reads_its_own_share_of_the_files_and_together_all_of_them(embedded_shards_in_files, pipelines):
    uri = embedded_shards_in_files["train"]
    files = shard_files(uri, read_manifest(uri))
    shares = [input_share(files, pipelines, host, seed=5) for host in range(pipelines)]
    assert sorted(file for share in shares for file in share) == sorted(files)  # disjoint, and the whole set
    assert all(len(share) >= len(files) // pipelines for share in shares)
    assert shares == [input_share(files, pipelines, host, seed=5) for host in range(pipelines)]  # a seed's
    assert shares != [input_share(files, pipelines, host, seed=6) for host in range(pipelines)]
    assert input_share(files, 1, 0, seed=5) == files  # one host reads the set as it is


def unmasked_rows(batches: list[dict]) -> np.ndarray:
    """Each sample's original ids (labels where masked), with its masked ids and labels, sorted by the former."""
    rows = np.concatenate(
        [
            np.concatenate([np.where(b["labels"] >= 0, b["labels"], b["input_ids"]), b["input_ids"], b["labels"]], 1)
            for b in batches
        ]
    )
    return rows[np.lexsort(rows.T[::-1])]


@pytest.mark.parametrize("pipelines", [2, 8])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_validation_shards_of_fewer_files_than_hosts_are_shared_by_record(embedded_shards_in_files, pipelines):
    """A v5e-32's 8 hosts over 5 validation files (or 2 hosts over 1): each host reads every file and keeps every
    n-th record; together every sample once, with the one-host masks, and full batches as many on every host."""
    uri = embedded_shards_in_files["validation" if pipelines == 8 else "train"]
    manifest = read_manifest(uri)
    if pipelines == 2:  # one file of the training set, read as validation
        manifest = {**manifest, "files": manifest["files"][:1], "num_records": manifest["files"][0]["records"]}
    assert len(manifest["files"]) < pipelines
    masking = Masking.from_manifest(manifest)
    one_host = list(evaluation_dataset(uri, manifest, 16, masking))
    per_host = [list(evaluation_dataset(uri, manifest, 16, masking, context)) for context in contexts(pipelines)]
    batches = [b for host in per_host for b in host]
    np.testing.assert_array_equal(unmasked_rows(batches), unmasked_rows(one_host))
    assert sum(len(b["input_ids"]) for b in batches) == manifest["num_records"]
    per_replica = 16 // (2 * pipelines)
    full = [
        len(list(evaluation_dataset(uri, manifest, 16, masking, context, drop_remainder=True)))
        for context in contexts(pipelines)
    ]
    assert full == [manifest["num_records"] // pipelines // per_replica // 2 * 2] * pipelines and full[0] > 0


@pytest.mark.parametrize("pipelines", [2, 4])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_evaluation_scores_every_sample_once_with_the_same_masks_whatever_the_hosts(
    embedded_shards_in_files, pipelines
):
    """Split over hosts, the evaluation pass still covers each sample once, masked at the same positions as on one
    host (a sample's masks come from its file and record), in per-replica batches; each host reads every n-th record,
    so no host is short of batches because its files are small."""
    uri = embedded_shards_in_files["validation"]
    manifest = read_manifest(uri)
    masking = Masking.from_manifest(manifest)
    one_host = [b for b in evaluation_dataset(uri, manifest, 8, masking)]
    per_host = [list(evaluation_dataset(uri, manifest, 8, masking, context)) for context in contexts(pipelines)]
    batches = [b for host in per_host for b in host]
    assert all(b["input_ids"].shape[0] <= 8 // (2 * pipelines) for b in batches)  # per-replica batches
    np.testing.assert_array_equal(unmasked_rows(batches), unmasked_rows(one_host))
    assert sum(len(b["input_ids"]) for b in batches) == manifest["num_records"]
    # full batches only (a TPU's): every host as many, its share of the records (every n-th), whatever the files
    full = [
        len(list(evaluation_dataset(uri, manifest, 8, masking, context, drop_remainder=True)))
        for context in contexts(pipelines)
    ]
    fewest = manifest["num_records"] // pipelines // (8 // (2 * pipelines))
    assert full == [fewest // 2 * 2] * pipelines and fewest > 0


def records_of(files: list[str]) -> set[tuple]:
    spec = {"input_ids": tf.io.FixedLenFeature([128], tf.int64)}
    return {tuple(tf.io.parse_single_example(r, spec)["input_ids"].numpy()) for r in tf.data.TFRecordDataset(files)}


def masked_share(batch: dict, masking: Masking) -> float:
    special = np.isin(np.where(batch["labels"] >= 0, batch["labels"], batch["input_ids"]), masking.special_token_ids)
    return float((batch["labels"] >= 0).sum() / (~special).sum())


@pytest.mark.parametrize("pipelines", [2, 4])
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_each_host_streams_its_share_the_same_for_a_seed_with_masks_of_its_own(embedded_shards_in_files, pipelines):
    """Two replicas a host: a host's batches 2k and 2k+1 are micro-step k's, masked at its rate of the decay."""
    uri = embedded_shards_in_files["train"]
    manifest = read_manifest(uri)
    masking = Masking.from_manifest(manifest, 0.3, final_probability=0.15, decay_batches=4)

    def streams(seed: int) -> list[list[dict]]:
        return [
            [
                {name: tensor.numpy() for name, tensor in batch.items()}
                for batch in training_dataset(uri, manifest, 64, masking, context, seed=seed).take(6)
            ]
            for context in contexts(pipelines)
        ]

    first, again, other = streams(3), streams(3), streams(4)
    assert all(batch["input_ids"].shape == (64 // (2 * pipelines), 128) for host in first for batch in host)
    for host, host_again in zip(first, again, strict=True):
        for batch, batch_again in zip(host, host_again, strict=True):
            np.testing.assert_array_equal(batch["labels"], batch_again["labels"])
    assert not np.array_equal(first[0][0]["labels"], other[0][0]["labels"])
    assert not np.array_equal(first[0][0]["labels"], first[1][0]["labels"])
    shares = [np.mean([masked_share(host[k], masking) for host in first]) for k in range(6)]
    assert shares == pytest.approx([0.3, 0.3, 0.2625, 0.2625, 0.225, 0.225], abs=0.03)
    files = shard_files(uri, manifest)
    for host, batches in enumerate(first):  # a host's samples come from its own files only
        share = input_share(files, pipelines, host, seed=3)
        mine = {tuple(row) for row in unmasked_rows(batches)[:, :128]}
        assert mine and not mine & records_of([file for file in files if file not in share])


def test_a_cut_evaluation_pass_reads_files_from_across_the_set_first():
    """The evaluation reads 16 files at a time: its first 16 are spread over every part's files, not the first 16."""
    assert spread_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    for count in (1, 5, 16, 100, 1000):
        order = spread_order(count)
        assert sorted(order) == list(range(count))
        first = sorted(order[: min(16, count)])
        assert first[-1] >= count * 0.9 - 1 and all(b - a <= count / 8 + 1 for a, b in itertools.pairwise(first))
