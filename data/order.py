"""The order of a training stream's records in each epoch, and which records each stream reads.

Sharding: `training_share` gives each of W training streams its files, or a fixed share of one file's records
when there are fewer files than streams; `eval_records` gives an eval worker its records, each once.

Order, twice: `training_records` is tf.data's pipeline over a stream's files, and `StreamOrder` computes the
same order as tensor ops over a decoded cache's record ids. Epoch e of a stream is: its files in a stateless
random order keyed on (seed, e, 0), read by a parallel interleave (cycle of `cycle_length` files, one chunk of
up to `CHUNK` records from each in turn, every file ending with an empty chunk), chunk c shuffled by a
stateless shuffle keyed on (seed, e, c + 1), every `shares`-th record kept, then a shuffle buffer with a fixed
seed. A decoded cache (`data.cache`) knows how many records each file holds, so `epoch_ids` computes that same
order of record ids in one step per epoch, without a tf.data element per record: the per-record elements
(unbatch, shuffle buffer, a position per record) cost ~4.9 ms of CPU per batch of 128 digits, a third of a
training step. The two live here together: a change to one is a change to the other (tests/data/test_order.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import tensorflow as tf

from data.integrity import CHUNK

# Parallel interleave reads at most this many files at once; more only costs memory for read buffers.
MAX_CYCLE_LENGTH = 8
# Distinct stateless seeds per epoch: its file order, and one per chunk of records (2^40 chunks).
_PARTS_PER_EPOCH = 1 << 40


def cycle_length(num_files: int) -> int:
    """Files the reader's interleave reads at once."""
    return min(num_files, MAX_CYCLE_LENGTH)


def part_key(seed: int, epoch: tf.Tensor, part) -> tf.Tensor:
    """Stateless seed of one part of an epoch (0: its file order, c + 1: its chunk c), int64 [2]."""
    return tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64) * _PARTS_PER_EPOCH + part])


def shuffled_files(files, seed: int, epoch: tf.Tensor) -> tf.Tensor:
    """The epoch's order of `files` (a list or a tensor of paths or of indices)."""
    return tf.random.experimental.stateless_shuffle(tf.convert_to_tensor(files), seed=part_key(seed, epoch, 0))


class Share(NamedTuple):
    """A training stream's files, and which of their records it keeps: every `count`-th from the `index`-th."""

    files: list[str]
    index: int
    count: int


def training_share(files: tuple[str, ...], worker_index: int, num_workers: int) -> Share:
    """Worker w's files, and which share of their records it keeps.

    With at least as many files as workers, worker w reads files[w::W], every record. With fewer (F < W),
    worker w reads file w % F alone and keeps every c-th record from the (w // F)-th, c being the number of
    workers on that file: every record still goes to exactly one worker, each worker's records are fixed by
    (w, W), and only the bytes of a shared file are read more than once.
    """
    if len(files) >= num_workers:
        return Share(list(files[worker_index::num_workers]), 0, 1)
    file_index = worker_index % len(files)
    sharing = len(range(file_index, num_workers, len(files)))
    return Share([files[file_index]], worker_index // len(files), sharing)


def eval_records(files: tuple[str, ...], worker_index: int, num_workers: int) -> tf.data.Dataset:
    """Eval worker w's serialized records, in file order: each record of `files` goes to exactly one worker."""
    if len(files) >= num_workers:
        return tf.data.TFRecordDataset(list(files[worker_index::num_workers]))
    # Too few files to give each worker its own: every worker reads all files and keeps every
    # num_workers-th record. Slower, but eval must see each example exactly once whatever the sharding.
    return tf.data.TFRecordDataset(list(files)).shard(num_workers, worker_index)


def training_records(share, seed: int, shuffle_buffer: int, read_chunks, start: tuple[int, int]) -> tf.data.Dataset:
    """(e, (i + 1, record)) forever, epoch after epoch, from `start` = (epoch, record index) on.

    Epoch e is a pipeline of its own, seeded by (seed, e): its files in a random order, read in parallel but
    deterministically, its records shuffled. So record i of epoch e is a function of (seed, e, i) alone, and
    a position is resumed by rebuilding epoch e and skipping i records (read, not decoded: at most one
    epoch's bytes of this worker's share). The record's position is (e, i + 1): where the next record is.
    `read_chunks(path)` yields a file's records in chunks (`data.integrity.BadRecords.chunk_reader`).
    """
    own_files, share_index, shares = share
    first_epoch, first_record = start

    def epoch_records(epoch):
        # Stateless ops keyed on (seed, epoch): tf.data's own seeded shuffle cannot take a per-epoch seed
        # tensor (with a global seed of 0 it tests the tensor as a Python bool). So the file order and the
        # order inside each chunk of records change with the epoch; the buffer shuffle's seed is fixed.
        # `StreamOrder` computes this same order over a decoded cache's record ids: keep the two in step.
        epoch = tf.cast(epoch, tf.int64)
        files = shuffled_files(own_files, seed, epoch)
        # Each file yields chunks of its records (data.integrity counts their bytes to find corrupt ones), and
        # whole chunks cross the interleave: its per-element cost is then paid per chunk, not per record.
        chunks = tf.data.Dataset.from_tensor_slices(files).interleave(
            read_chunks,
            cycle_length=cycle_length(len(own_files)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        shuffle = tf.random.experimental.stateless_shuffle
        chunks = chunks.enumerate().map(lambda c, chunk: shuffle(chunk, part_key(seed, epoch, c + 1)))
        records = chunks.unbatch()
        if shares > 1:
            records = records.shard(shares, share_index)
        # Shuffle the serialized records, not the decoded float tensors: the buffer (in memory) is then as
        # small as the files, e.g. ~100 KB per ImageNet JPEG instead of 600 KB.
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
        # The position (e, i + 1) is stacked per batch (`position_batches`), not per record: a map per record
        # cost 3.7 ms of CPU per batch of 128 digits, where the whole order costs 0.7 ms without it.
        return tf.data.Dataset.zip(tf.data.Dataset.from_tensors(epoch).repeat(), records.enumerate(start=1))

    resumed = epoch_records(tf.constant(first_epoch, tf.int64)).skip(first_record)
    return resumed.concatenate(tf.data.Dataset.counter(first_epoch + 1).flat_map(epoch_records))


def position_batches(records: tf.data.Dataset, batch_size: int, drop: bool) -> tf.data.Dataset:
    """(positions int64 [B, 2], records [B]) batches of `training_records`."""
    batches = records.batch(batch_size, drop_remainder=drop)
    return batches.map(lambda epochs, pairs: (tf.stack([epochs, pairs[0]], axis=1), pairs[1]))


def buffer_order(num_records: int, shuffle_buffer: int, seed: int) -> tf.Tensor:
    """Where the reader's shuffle buffer takes each output record from: int64 [num_records], a permutation.

    The buffer (`Dataset.shuffle` with a fixed seed, rebuilt every epoch) picks from what it holds with
    random draws that depend on its seed and on how many records it holds, never on the records, so it
    permutes every epoch's `num_records` records alike. Call it where the reader's pipeline is built: the
    seed pair includes the global seed (`tf.random.set_seed`) at that moment.
    """
    if num_records == 0:
        return tf.zeros([0], tf.int64)
    positions = tf.data.Dataset.range(num_records).shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
    return positions.batch(num_records).get_single_element()


@dataclasses.dataclass(frozen=True)
class StreamOrder:
    """What fixes the order of a stream's records: its files' record counts, seed, share and buffer.

    Attributes:
        starts, counts: Per file of the stream (in the reader's file order), its first record id and
            number of records.
        seed: The reader's seed.
        share_index, shares: The stream keeps records share_index, share_index + shares, ... of each epoch.
        buffer: `buffer_order` of the records kept per epoch.
    """

    starts: tuple[int, ...]
    counts: tuple[int, ...]
    seed: int
    share_index: int
    shares: int
    buffer: tf.Tensor

    def epoch_ids(self, epoch: tf.Tensor) -> tf.Tensor:
        """The record ids of epoch `epoch` in the order the reader yields them, int64 [records kept]."""
        as_int64 = functools.partial(tf.constant, dtype=tf.int64)
        fields = (self.starts, self.counts, cycle_length(len(self.counts)), self.seed, self.share_index, self.shares)
        return _epoch_ids(tf.cast(epoch, tf.int64), *map(as_int64, fields), self.buffer)


def stream_order(starts, counts, share: Share, seed: int, shuffle_buffer: int) -> StreamOrder:
    """The order `training_records` gives `share`'s records, over a decoded cache's record ids: `starts` and
    `counts` per file of the share. Builds the buffer's order, so call it where the pipeline is built."""
    _, share_index, shares = share
    kept = len(range(share_index, sum(counts), shares))
    buffer = buffer_order(kept, shuffle_buffer, seed)
    return StreamOrder(starts, counts, seed, share_index, shares, buffer)


# One graph for every stream, traced once per process (the streams of a run differ only in these tensors):
# built per stream, its loops took ~0.3 s each, paid by every tower and every run.
@tf.function(
    autograph=False,
    input_signature=[tf.TensorSpec([], tf.int64)]
    + [tf.TensorSpec([None], tf.int64)] * 2
    + [tf.TensorSpec([], tf.int64)] * 4
    + [tf.TensorSpec([None], tf.int64)],
)
def _epoch_ids(epoch, starts, counts, cycle, seed, share_index, shares, buffer):
    """`StreamOrder.epoch_ids`, with its fields as tensors."""
    files = shuffled_files(tf.range(tf.size(counts, tf.int64)), seed, epoch)
    first, lengths = _chunks(files, starts, counts, cycle)
    ids = tf.map_fn(
        lambda args: _shuffled_chunk(*args, seed, epoch),
        (first, lengths, tf.range(1, tf.size(first, tf.int64) + 1)),
        fn_output_signature=tf.int64,
    )
    ids = tf.boolean_mask(ids, ids >= 0)[share_index::shares]
    return tf.gather(ids, buffer)


def _chunks(files, starts, counts, cycle) -> tuple[tf.Tensor, tf.Tensor]:
    """First id and length of every chunk (the empty end markers too) in the interleave's order."""
    counts = tf.gather(counts, files)
    chunks = counts // CHUNK + tf.cast(counts % CHUNK > 0, tf.int64) + 1  # with the end marker
    rounds, slots = _interleave_slots(chunks, cycle)
    file_of = tf.repeat(tf.range(tf.size(chunks, tf.int64)), chunks)  # per chunk: its file's place in files
    within = tf.range(tf.reduce_sum(chunks)) - tf.gather(tf.cumsum(chunks, exclusive=True), file_of)
    turn = (tf.gather(rounds, file_of) + within) * cycle + tf.gather(slots, file_of)
    order = tf.argsort(turn, stable=True)
    file_of, within = tf.gather(file_of, order), tf.gather(within, order)
    first = tf.gather(tf.gather(starts, files), file_of) + within * CHUNK
    lengths = tf.clip_by_value(tf.gather(counts, file_of) - within * CHUNK, 0, CHUNK)
    return first, lengths


def _shuffled_chunk(first, length, part, seed, epoch) -> tf.Tensor:
    ids = tf.random.experimental.stateless_shuffle(tf.range(first, first + length), part_key(seed, epoch, part))
    return tf.pad(ids, [[0, CHUNK - length]], constant_values=-1)


def _interleave_slots(chunks: tf.Tensor, cycle: int | tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Round and slot at which the interleave opens each file (in the epoch's order), yielding `chunks[k]`
    chunks from file k: chunk j at round + j in its slot, and turn (round, slot) comes before (round, slot+1).

    tf.data's deterministic interleave fills its `cycle` slots with files in turn order; a file's slot
    notices its end one round after its last chunk, and the next file opens there one round later still
    (tests/data/test_order.py checks this against `Dataset.interleave` for many files and counts).
    """
    slot_ids = tf.range(cycle, dtype=tf.int64)  # `cycle` may be a tensor

    def open_file(state, num_chunks):
        free_round, _, _ = state
        slot = tf.argmin(free_round * cycle + slot_ids, output_type=tf.int64)
        start = free_round[slot]
        free_round = tf.tensor_scatter_nd_update(free_round, [[slot]], [start + num_chunks + 1])
        return free_round, start, slot

    zero = tf.constant(0, tf.int64)
    _, rounds, slots = tf.scan(open_file, chunks, initializer=(tf.zeros([cycle], tf.int64), zero, zero))
    return rounds, slots


def id_batches(order: StreamOrder, start: tuple[int, int], batch_size: int, drop_remainder: bool) -> tf.data.Dataset:
    """(positions int64 [B, 2], ids int64 [B]) batches forever from `start` = (epoch, record index): the
    reader's batches of (position, record) pairs, with record ids for records. One tf.data element per epoch,
    cut into batches by `rebatch` (batches span epochs, as the reader's do)."""
    first_epoch, first_record = start

    def epoch(number):
        ids = order.epoch_ids(number)
        records = tf.range(1, tf.size(ids, tf.int64) + 1)
        return tf.stack([tf.fill(tf.shape(ids), number), records], axis=1), ids

    def resumed(index, epoch_records):  # the first epoch starts at `first_record`
        skip = tf.where(index == 0, tf.constant(first_record, tf.int64), 0)
        return tuple(part[skip:] for part in epoch_records)

    # One map of `epoch` (its graph, with loops, takes ~0.1 s to build per stream), then a cheap cut.
    epochs = tf.data.Dataset.counter(first_epoch).map(epoch).enumerate().map(resumed).prefetch(1)
    return epochs.rebatch(batch_size, drop_remainder=drop_remainder)
