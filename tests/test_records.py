import numpy as np
import pytest
import tensorflow as tf

from components.lib.records import feature_spec, serialize_examples, tfrecord_frame, varint


def reference_example(ids: np.ndarray) -> tf.train.Example:
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids.tolist())),
                "attention_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=[1] * len(ids))),
            }
        )
    )


@pytest.mark.parametrize("largest", [100, 25_000, 2**21 + 5, 2**34])
def test_batch_serializer_writes_the_protobuf_tf_train_example_writes(largest):
    rng = np.random.default_rng(largest)
    ids = rng.integers(0, largest, size=(64, 128))
    ids[0] = 0
    ids[1] = 127  # the widths where varints change size
    ids[2] = 128
    ids[3] = largest - 1
    records = serialize_examples(ids)
    assert len(records) == len(ids)
    for row, record in zip(ids, records, strict=True):
        assert tf.train.Example.FromString(record) == reference_example(row)
        assert len(record) == reference_example(row).ByteSize()
        parsed = tf.io.parse_single_example(record, feature_spec(128))
        assert parsed["input_ids"].numpy().tolist() == row.tolist()


def test_serializer_refuses_ids_it_cannot_encode():
    with pytest.raises(ValueError, match="non-negative"):
        serialize_examples(np.array([[1, -1]]))


def test_varint():
    assert [varint(v) for v in (0, 1, 127, 128, 300)] == [b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02"]


def test_a_framed_record_is_the_bytes_tensorflow_s_writer_writes_and_its_reader_checks(tmp_path):
    records = [b"", b"x", bytes(range(256)) * 40, *serialize_examples(np.arange(64).reshape(2, 32))]
    reference = tmp_path / "reference.tfrecord"
    with tf.io.TFRecordWriter(str(reference)) as writer:
        for record in records:
            writer.write(record)
    framed = b"".join(tfrecord_frame(record) for record in records)
    assert framed == reference.read_bytes()
    ours = tmp_path / "ours.tfrecord"
    ours.write_bytes(framed[:-1] + bytes([framed[-1] ^ 1]))  # the last record's checksum, one bit off
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(ours)))
