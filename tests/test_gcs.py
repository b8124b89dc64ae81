"""The jobs on ``gs://``: TensorFlow's own GCS filesystem talking to a local emulator (see gcs_routing).

Every object is checked through a second, independent client (google-cloud-storage) so that a test cannot
pass by writing to some local fallback.
"""

import json
from pathlib import Path

import pytest
from conftest import run_module
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs_client
from kfp.dsl import Artifact

from components.lib import storage
from components.lib.job_runner import REFUSED_EXIT
from components.shards import ShardArguments, write_shards
from components.tokenizer import TokenizerArguments, train_tokenizer
from pipelines.steps import STEPS, make_component


def bucket_objects(prefix: str) -> dict[str, bytes]:
    """Every object under ``gs://bucket/prefix``, read with google-cloud-storage from the emulator."""
    client = gcs_client.Client(project="test", credentials=AnonymousCredentials())
    bucket_prefix = prefix.removeprefix("gs://bucket/")
    return {
        blob.name.removeprefix(bucket_prefix).lstrip("/"): blob.download_as_bytes()
        for blob in client.list_blobs("bucket", prefix=bucket_prefix)
        if not blob.name.endswith("/")  # TensorFlow's folder markers
    }


def test_tensorflow_writes_renames_and_lists_in_the_emulator(gcs):
    uri = storage.join(gcs, "folder", "file.json")
    storage.write_text_atomic(uri, '{"a": 1}')
    assert storage.read_text(uri) == '{"a": 1}'
    assert storage.listdir(storage.join(gcs, "folder")) == ["file.json"]  # the temporary name is gone
    assert storage.size(uri) == 8
    assert bucket_objects(gcs) == {"folder/file.json": b'{"a": 1}'}


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_the_steps_need_no_bucket_permission_only_object_ones(gcs):
    """The stand-in answers as Cloud Storage does for the README's account (object roles only): the bucket's
    metadata is a 403. TensorFlow's recursive makedirs walks up to the bucket's root and asks for it; the storage
    layer's does not, and TensorFlow's own folder-making (checkpoints, summaries) below its folders stops there."""
    import tensorflow as tf

    with pytest.raises(tf.errors.PermissionDeniedError) as denied:
        tf.io.gfile.makedirs(storage.join(gcs, "fresh", "prefix"))
    assert storage.permission_denied(denied.value, [gcs, "/a/local/folder"]) == (
        "permission denied on gs://bucket: the account lacks storage.buckets.get (the README's service account step "
        "lists the roles the steps need)"
    )
    assert storage.permission_denied(ValueError("storage.buckets.get gs://bucket/")) == ""
    folder = storage.join(gcs, "run", "checkpoints")
    storage.makedirs(folder)
    storage.makedirs(folder)  # again: it exists
    checkpoint = tf.train.Checkpoint(step=tf.Variable(3))
    tf.train.CheckpointManager(checkpoint, storage.join(folder, "deeper"), max_to_keep=1).save()
    with tf.summary.create_file_writer(storage.join(folder, "logs")).as_default():
        tf.summary.scalar("loss", 1.0, step=1)
        tf.summary.flush()
    names = bucket_objects(folder)
    assert "deeper/checkpoint" in names and any(name.startswith("logs/events.out.tfevents.") for name in names)
    # the bucket itself, given as a folder: taken as one, without asking for its metadata
    assert storage.exists("gs://bucket") and storage.isdir("gs://bucket/")
    at_the_root = f"gs://bucket/{gcs.rsplit('/', 1)[1]}.json"
    storage.write_text_atomic(at_the_root, "{}")
    assert storage.read_text(at_the_root) == "{}"


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_storage_permission_error_is_one_line_naming_the_uri_and_the_permission(gcs, capsys):
    from gcs_routing import NOT_GRANTED_BUCKET

    output = f"gs://{NOT_GRANTED_BUCKET}/run/tokenizer"
    result = run_module("components.tokenizer", "--corpus", "embedded", "--vocab_size", "500", "--output", output)
    # status 3: a refusal the same account meets again, which the TPU task's launcher does not retry
    assert result.returncode == REFUSED_EXIT and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: permission denied on {output}/: the account lacks storage.objects.create (the README's service "
        "account step lists the roles the steps need)"  # the folder's marker, its first write
    )
    # the same step as a pipeline component (what runs on Vertex AI): the same line and status
    tokenizer_step = make_component(STEPS["tokenizer"], "image").python_func
    with pytest.raises(SystemExit) as ended:
        tokenizer_step(tokenizer=Artifact(uri=output), corpus="embedded", vocab_size=500)
    assert ended.value.code == REFUSED_EXIT and ended.value.__suppress_context__  # no TensorFlow traceback under it
    assert capsys.readouterr().err.strip().splitlines()[-1] == result.stderr.strip().splitlines()[-1]


@pytest.mark.slow  # 16 s: out of the fast tier (make test-fast under 3 minutes)
def test_shards_from_gs_to_gs_equal_a_local_run_byte_for_byte(gcs, tmp_path, wikitext):
    corpus = storage.join(gcs, "corpus", "valid.txt")
    storage.write_bytes_atomic(corpus, (wikitext / "valid.txt").read_bytes())
    tokenizer = storage.join(gcs, "tokenizer")  # one tokenizer for both: Unigram training is not deterministic
    train_tokenizer(TokenizerArguments(output=tokenizer, corpus=corpus, vocab_size=2000))
    assert {"tokenizer.json", "tokenizer_summary.json"} <= bucket_objects(tokenizer).keys()
    outputs = {}
    for name, root in (("local", str(tmp_path)), ("gs", gcs)):
        source = corpus if name == "gs" else str(wikitext / "valid.txt")
        shards = storage.join(root, "shards")
        write_shards(ShardArguments(output=shards, tokenizer=tokenizer, corpus=source, records_per_shard=2000))
        outputs[name] = shards

    in_bucket = bucket_objects(outputs["gs"])
    files = [path for path in Path(outputs["local"]).rglob("*") if path.is_file()]
    local = {path.relative_to(outputs["local"]).as_posix(): path.read_bytes() for path in files}
    tfrecords = [name for name in in_bucket if name.endswith(".tfrecord")]
    assert len(tfrecords) >= 2 and not [name for name in in_bucket if name.endswith(storage.TEMP_SUFFIX)]
    assert in_bucket.keys() == local.keys()
    for name in tfrecords:
        assert in_bucket[name] == local[name], name
    manifests = [json.loads(side["manifest.json"]) for side in (in_bucket, local)]
    assert manifests[0]["files"] == manifests[1]["files"]
    assert manifests[0]["corpus"]["source"] == corpus and manifests[0]["num_records"] == manifests[1]["num_records"]
