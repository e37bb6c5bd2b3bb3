"""Token ids -> `tokens` records, streamed: windows cut as the ids arrive, serialized, dealt into shards.

`Windows` cuts one split's ids into records (data/text.py's module docstring says which); `Shards` writes
them to TFRecord files, TRAIN_SHARDS of a split dealt contiguously (shard i holds records [i*N//S,
(i+1)*N//S)). When N is known before the first record (byte and char tokens over whole splits) records go
straight to their shard; otherwise into one file whose records are then copied, raw, into the shards.

A record is serialized here, not by `tf.train.Example`: the bytes are the same (a test compares them), but
building one Example per record costs ~11 us in Python, and a 2 GB corpus makes ~30 M records.
"""

from __future__ import annotations

import functools
import os
import struct

import numpy as np

# tf.train.Example{features{feature{key: "tokens", value{int64_list{value: [...]}}}}}: field tags and the key.
_KEY = b"\x0a\x06tokens"
MAX_ID = 1 << 21  # ids take at most 3 varint bytes: any char vocabulary (Unicode has 0x110000 code points)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varints(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the protobuf varints of ids in [0, 2**21), concatenated, as uint8; each id's byte count)."""
    values = ids.astype(np.int64, copy=False).ravel()
    largest = int(values.max()) if len(values) else 0
    if not 0 <= largest < MAX_ID:
        raise ValueError(f"token id {largest} is not in [0, {MAX_ID})")
    table, sizes = _varint_table(next(w for w in (1, 2, 3) if largest < 1 << (7 * w)))
    sizes = sizes[values]
    return table[values][np.arange(table.shape[1]) < sizes[:, None]], sizes


@functools.lru_cache(maxsize=3)
def _varint_table(width: int) -> tuple[np.ndarray, np.ndarray]:
    """(the varint bytes of 0 .. 2**(7*width) - 1, [n, width] padded with zeros; their sizes, int64)."""
    values = np.arange(1 << (7 * width), dtype=np.int64)
    sizes = np.ones(values.shape, np.int64)
    for bits in range(7, 7 * width, 7):
        sizes += values >= (1 << bits)
    table = np.zeros([len(values), width], np.uint8)
    for k in range(width):
        table[:, k] = ((values >> (7 * k)) & 0x7F) | ((sizes > k + 1) << 7)
    return table, sizes


def serialize(windows: np.ndarray) -> list[bytes]:
    """Each row of `windows` ([count, length] ids) as a serialized tf.train.Example of `tokens`."""
    if len(windows) == 0:
        return []
    data, sizes = _varints(windows)
    data = data.tobytes()
    ends = np.cumsum(sizes.reshape(windows.shape).sum(axis=1)).tolist()
    records, begin = [], 0
    for end in ends:
        records.append(_header(end - begin) + data[begin:end])
        begin = end
    return records


@functools.lru_cache(maxsize=4096)
def _header(size: int) -> bytes:
    """The Example's bytes before a payload of `size` bytes of varints (they depend on nothing else)."""
    int64_list = b"\x0a" + _varint(size)
    feature = b"\x1a" + _varint(len(int64_list) + size) + int64_list
    entry = _KEY + b"\x12" + _varint(len(feature) + size) + feature
    features = b"\x0a" + _varint(len(entry) + size) + entry
    return b"\x0a" + _varint(len(features) + size) + features


class Windows:
    """One split's records from its ids: `add(ids)` as they come, `end_document()` at each document's end.

    Windows of context + 1 ids with stride context; a document's last window is kept short, one of a single id
    (nothing to predict) dropped. Calls `emit(list of serialized records)`.
    """

    def __init__(self, context: int, emit):
        self.context, self.emit = context, emit
        self.carry = np.zeros([0], np.int64)
        self.tokens = 0  # ids seen
        self.records = 0  # records emitted

    def add(self, ids: np.ndarray) -> None:
        self.tokens += len(ids)
        ids = np.concatenate([self.carry, ids.astype(np.int64, copy=False)]) if len(self.carry) else ids
        count = (len(ids) - 1) // self.context if len(ids) > self.context else 0
        if count:
            view = np.lib.stride_tricks.sliding_window_view(ids, self.context + 1)[:: self.context][:count]
            self._emit(serialize(view))
        self.carry = np.array(ids[count * self.context :], np.int64)

    def end_document(self) -> None:
        if len(self.carry) >= 2:
            self._emit(serialize(self.carry[None, :]))
        self.carry = np.zeros([0], np.int64)

    def _emit(self, records: list[bytes]) -> None:
        self.records += len(records)
        self.emit(records)


class Shards:
    """Writes one split's records into `num_shards` files `prefix-0000i-of-0000N.tfrecord`, dealt contiguously.

    Args:
        prefix: e.g. OUT/train.
        expected: The record count when known before the first record (records then go straight to their
            shard), None to count them first (into `prefix.all`, split by `close`).
        num_shards: At most this many files; fewer when there are fewer records.
    """

    def __init__(self, prefix: str, expected: int | None, num_shards: int):
        from data import native_log

        # Only once the arguments and the text are known to be good, and a subword model trained (TensorFlow
        # holds ~630 MB resident); its start-up lines hidden as `python -m trainer` hides them.
        with native_log.quiet_first_import(native_log.QUIET_LEVEL):
            import tensorflow as tf

        self.tf, self.prefix, self.expected, self.num_shards = tf, prefix, expected, num_shards
        self.count, self.shard, self.writer = 0, -1, None
        if expected is None:
            self.writer = tf.io.TFRecordWriter(prefix + ".all")
        else:
            self.num_shards = max(1, min(num_shards, expected))

    def write(self, records: list[bytes]) -> None:
        for record in records:
            # shard i holds records [i*N//S, (i+1)*N//S): open the next at its first record
            while self.expected is not None and self.count == (self.shard + 1) * self.expected // self.num_shards:
                self._open(self.shard + 1)
            self.writer.write(record)
            self.count += 1

    def close(self) -> tuple[int, int]:
        """(records written, shards written); checks a known count was met."""
        if self.writer is not None:
            self.writer.close()
        if self.expected is None:
            self.num_shards = max(1, min(self.num_shards, self.count))
            _split_raw(self.prefix, self.count, self.num_shards)
        elif self.count != self.expected:
            raise AssertionError(f"{self.prefix}: {self.count} records written, {self.expected} counted")
        return self.count, self.num_shards

    def _open(self, shard: int) -> None:
        if self.writer is not None:
            self.writer.close()
        self.shard, self.writer = shard, None
        self.writer = self.tf.io.TFRecordWriter(shard_path(self.prefix, shard, self.num_shards))


def shard_path(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}-{shard:05d}-of-{num_shards:05d}.tfrecord"


def _split_raw(prefix: str, count: int, num_shards: int) -> None:
    """prefix.all's `count` records -> `num_shards` shards by byte ranges (a TFRecord is 12 header bytes, the
    data and 4 bytes of its checksum), then prefix.all is removed."""
    source = prefix + ".all"
    with open(source, "rb") as f:
        bounds, index = [0], 0
        for shard in range(1, num_shards):
            while index < shard * count // num_shards:
                (length,) = struct.unpack("<Q", f.read(12)[:8])
                f.seek(length + 4, os.SEEK_CUR)
                index += 1
            bounds.append(f.tell())
        bounds.append(os.path.getsize(source))
        for shard in range(num_shards):
            f.seek(bounds[shard])
            with open(shard_path(prefix, shard, num_shards), "wb") as out:
                _copy(f, out, bounds[shard + 1] - bounds[shard])
    os.remove(source)


def _copy(source, target, size: int, block: int = 8 << 20) -> None:
    while size > 0:
        data = source.read(min(block, size))
        target.write(data)
        size -= len(data)
