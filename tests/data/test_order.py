"""Tests of data/order.py: the reader's epoch order computed as tensor ops over a decoded cache's record ids
equals the order tf.data gives, for many files, uneven counts, shares, buffers and resume points."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import data
from data import order
from data.integrity import CHUNK
from tests.support.records import _images


def _id_reader(counts):
    """`read(path)` for files named "0", "1", ...: file f's record ids in the chunks (and the empty end marker)
    `BadRecords.chunk_reader` gives its records."""
    starts = tf.constant(np.cumsum([0, *counts[:-1]]), tf.int64)
    counts_t = tf.constant(counts, tf.int64)

    def read(path):
        f = tf.strings.to_number(path, tf.int64)
        ids = tf.data.Dataset.range(starts[f], starts[f] + counts_t[f]).batch(CHUNK)
        return ids.concatenate(tf.data.Dataset.from_tensors(tf.zeros([0], tf.int64)))

    return read


def _reader_stream(counts, seed, shuffle_buffer, share_index, shares, start, num_records):
    """Positions and ids of the first `num_records` records of the reader's own pipeline over ids."""
    share = ([str(f) for f in range(len(counts))], share_index, shares)
    records = order.training_records(share, seed, shuffle_buffer, _id_reader(counts), start)
    positions, ids = order.position_batches(records, num_records, True).take(1).get_single_element()
    return positions.numpy(), ids.numpy()


def _order_stream(counts, seed, shuffle_buffer, share_index, shares, start, num_records, batch_size=37):
    kept = len(range(share_index, sum(counts), shares))
    starts = tuple(int(v) for v in np.cumsum([0, *counts[:-1]]))
    stream = order.StreamOrder(
        starts, tuple(counts), seed, share_index, shares, order.buffer_order(kept, shuffle_buffer, seed)
    )
    batches = order.id_batches(stream, start, batch_size, drop_remainder=True)
    batches = list(batches.take(-(-num_records // batch_size)).as_numpy_iterator())
    positions = np.concatenate([p for p, _ in batches])[:num_records]
    return positions, np.concatenate([i for _, i in batches])[:num_records]


@pytest.mark.parametrize(
    ("counts", "shuffle_buffer", "share_index", "shares"),
    [
        ([0, 1, 64, 65, 130], 10_000, 0, 1),  # empty file, chunk boundaries, fewer files than the cycle
        ([37, 0, 200, 5, 64, 91, 3, 128, 17, 250, 1], 7, 0, 1),  # 11 files: the interleave reopens slots
        ([int(c) for c in np.random.default_rng(3).integers(0, 90, 20)], 50, 0, 1),
        ([301], 16, 1, 3),  # one file shared by three streams
        ([64, 64, 64, 64, 64, 64, 64, 64, 64], 1, 0, 1),  # equal files, no shuffle buffer
    ],
)
def test_epoch_order_equals_the_readers(counts, shuffle_buffer, share_index, shares):
    kept = len(range(share_index, sum(counts), shares))
    for start in [(0, 0), (2, 0), (1, kept // 2), (3, kept - 1), (0, kept)]:
        expected = _reader_stream(counts, 5, shuffle_buffer, share_index, shares, start, 2 * kept + 3)
        got = _order_stream(counts, 5, shuffle_buffer, share_index, shares, start, 2 * kept + 3)
        np.testing.assert_array_equal(got[1], expected[1], err_msg=f"ids from {start}")
        np.testing.assert_array_equal(got[0], expected[0], err_msg=f"positions from {start}")


def test_epoch_order_follows_the_global_seed():
    counts = [70, 3, 40]
    tf.random.set_seed(11)  # the shuffle buffer's seed pair includes it
    try:
        expected = _reader_stream(counts, 2, 20, 0, 1, (0, 0), 300)
        got = _order_stream(counts, 2, 20, 0, 1, (0, 0), 300)
    finally:
        tf.random.set_seed(None)
    np.testing.assert_array_equal(got[1], expected[1])


def test_interleave_slots_match_tf_data():
    rng = np.random.default_rng(0)
    for _ in range(40):
        num_files = int(rng.integers(1, 14))
        cycle = int(rng.integers(1, num_files + 1))
        chunks = [int(c) for c in rng.integers(1, 6, num_files)]
        lengths = tf.constant(chunks, tf.int64)
        real = tf.data.Dataset.range(num_files).interleave(
            lambda f: tf.data.Dataset.range(lengths[f]).map(lambda j: f * 100 + j),  # noqa: B023
            cycle_length=cycle,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        rounds, slots = order._interleave_slots(lengths, cycle)
        opened = enumerate(zip(rounds.numpy(), slots.numpy(), strict=True))
        turns = [((r + j) * cycle + s, f * 100 + j) for f, (r, s) in opened for j in range(chunks[f])]
        assert [v for _, v in sorted(turns)] == list(real.as_numpy_iterator()), (chunks, cycle)


def _uneven_records(tmp_path, counts, size=(6, 5)):
    patterns = []
    for k, count in enumerate(counts):
        images = _images(count, *size, 1, seed=k)
        data.write_image_records(str(tmp_path / f"part{k}"), images, np.arange(count) % 10)
        patterns.append(str(tmp_path / f"part{k}-*"))
    return data.inspect_records(",".join(patterns))


def _stream(info, cache, start, n, worker_index=0, num_workers=1):
    decoded = data.decode_share(info, worker_index=worker_index, num_workers=num_workers) if cache else None
    dataset = data.make_dataset(
        info, batch_size=16, training=True, seed=3, worker_index=worker_index, num_workers=num_workers,
        shuffle_buffer=40, preprocess=data.Preprocess("crop_flip"), resume_from=start, cache=decoded,
    )  # fmt: skip
    return [tuple(t.numpy() for t in batch) for batch in dataset.take(n)]


@pytest.mark.parametrize(("worker_index", "num_workers"), [(0, 1), (1, 2), (3, 5)])
def test_cached_batches_equal_uncached_at_every_cut(tmp_path, worker_index, num_workers):
    """Files of 3, 70 and 10 records, read by 1, 2 or 5 workers (5: fewer files than workers, shared files);
    resumed after several batches, over epoch boundaries, with crop_flip keyed on the positions."""
    info = _uneven_records(tmp_path, [3, 70, 10])
    shard = dict(worker_index=worker_index, num_workers=num_workers)
    uncached = _stream(info, False, (0, 0), 12, **shard)
    for cut in [0, 1, 4, 7]:
        start = (0, 0) if cut == 0 else tuple(int(v) for v in uncached[cut - 1][2])
        cached = _stream(info, True, start, 12 - cut - 1, **shard)
        for a, b in zip(uncached[cut:], cached, strict=False):
            for u, c in zip(a, b, strict=True):
                np.testing.assert_array_equal(u, c)
    epochs = {int(p[0]) for p in np.concatenate([b[2][None] for b in uncached])}
    assert len(epochs) > 1  # the stream crossed an epoch boundary
