"""The shard record format: ``tf.train.Example`` with fixed-length Int64 ``input_ids`` and ``attention_mask``, in
TFRecord files.

This is the reference recipe's format, so its reader (``tf.io.parse_single_example`` with
``FixedLenFeature``) reads our shards unchanged. Building one ``tf.train.Example`` per sample in Python
costs about 30 us, as much as a sixth of tokenizing it; :func:`serialize_examples` writes the same
protobuf bytes for a whole batch with numpy instead. :func:`tfrecord_frame` frames a record as TensorFlow's
``TFRecordWriter`` does, so that writing shards needs no TensorFlow (its import is about 4 s a step here).
"""

from __future__ import annotations

import functools
import struct

import google_crc32c
import numpy as np

FEATURE_NAMES = ("input_ids", "attention_mask")
_MAX_VARINT_BYTES = 5  # token ids are below 2**35


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(field_tag: int, payload: bytes) -> bytes:
    return bytes([field_tag]) + varint(len(payload)) + payload


def _packed_varints(values: np.ndarray) -> tuple[bytes, list[int]]:
    """Protobuf varint bytes of each row of non-negative ``values`` (rows x length), concatenated, and the
    number of bytes of each row."""
    largest = int(values.max()) if values.size else 0
    if values.size and (values.min() < 0 or largest >= 1 << (7 * _MAX_VARINT_BYTES)):
        raise ValueError("token ids must be non-negative and below 2**35")
    groups = max(1, (largest.bit_length() + 6) // 7)  # bytes of the widest varint in this batch
    values = values.astype(np.uint64 if groups > 4 else np.uint32, copy=False)
    widths = np.ones(values.shape, dtype=np.uint8)
    septets = np.empty((*values.shape, groups), dtype=np.uint8)
    for k in range(groups):
        septets[..., k] = (values >> (7 * k)) & 0x7F
        if k:
            widths += values >= (1 << (7 * k))
    for k in range(groups - 1):
        septets[..., k] |= (widths > k + 1).astype(np.uint8) << 7
    valid = np.arange(groups, dtype=np.uint8) < widths[..., None]
    return septets[valid].tobytes(), widths.sum(axis=1, dtype=np.int64).tolist()


@functools.cache
def _int64_feature_prefix(name: str, payload_length: int) -> bytes:
    """Bytes of a map entry ``name -> Feature(int64_list=...)`` up to its packed values."""
    int64_list_header = b"\x0a" + varint(payload_length)  # Int64List.value, packed (field 1)
    feature_length = len(int64_list_header) + payload_length
    feature_header = b"\x1a" + varint(feature_length)  # Feature.int64_list (field 3)
    key = _length_delimited(0x0A, name.encode())  # MapEntry.key (field 1)
    value_header = b"\x12" + varint(len(feature_header) + feature_length)  # MapEntry.value (field 2)
    entry_length = len(key) + len(value_header) + len(feature_header) + feature_length
    return b"\x0a" + varint(entry_length) + key + value_header + feature_header + int64_list_header


@functools.cache
def _all_ones_feature(name: str, length: int) -> bytes:
    return _int64_feature_prefix(name, length) + b"\x01" * length


@functools.cache
def _record_prefix(width: int, length: int) -> bytes:
    """Everything of a record before its packed ids, for ids that take ``width`` bytes."""
    features_length = (
        len(_int64_feature_prefix("input_ids", width)) + width + len(_all_ones_feature("attention_mask", length))
    )
    return b"\x0a" + varint(features_length) + _int64_feature_prefix("input_ids", width)  # Example.features


def serialize_examples(input_ids: np.ndarray) -> list[bytes]:
    """Serialized ``tf.train.Example`` records for the rows of ``input_ids`` (samples x max_length), each with
    an all-ones ``attention_mask`` (packed samples have no padding)."""
    length = input_ids.shape[1]
    payload, widths = _packed_varints(input_ids)
    mask_entry = _all_ones_feature("attention_mask", length)
    records = []
    end = 0
    for width in widths:
        start, end = end, end + width
        records.append(_record_prefix(width, length) + payload[start:end] + mask_entry)
    return records


def feature_spec(max_length: int) -> dict:
    """The ``FixedLenFeature`` spec that parses the records (as the reference recipe does)."""
    import tensorflow as tf

    return {name: tf.io.FixedLenFeature([max_length], tf.int64) for name in FEATURE_NAMES}


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated right by 15 bits plus a constant (TensorFlow's ``crc32c::Mask``)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(record: bytes) -> bytes:
    """``record`` as a TFRecord file holds it: its length (8 bytes, little-endian), the length's masked CRC-32C,
    the record, the record's masked CRC-32C (4 bytes each); the bytes ``tf.io.TFRecordWriter`` writes."""
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", _masked_crc32c(length)) + record + struct.pack("<I", _masked_crc32c(record))
