"""`python -m benchmarks.input_stages`: where a core's microseconds go per image in towerflow's JPEG pipelines.

Builds towerflow's training pipeline (`data.make_dataset`, 500x375 JPEGs -> 224x224, batch 32) stage by
stage, each pipeline one more stage than the last, and times them all in turns (one epoch each, one thread,
CPU-seconds, every window ending idle as in `benchmarks.input_figures`); a stage's cost is its pipeline's
median microseconds per image minus the previous one's. The stages are towerflow's own functions:

    read      the files' records in chunks (data.integrity's reader), batched; no shuffle
    shuffle   the reader's epoch order: files, chunks and the shuffle buffer, with positions (data.order)
    parse     tf.io.parse_example and the label check
    key       each example's stateless key (data.augment.example_keys)
    window    imagenet: the JPEG's shape and its random-resized-crop window
    decode    none: the whole image; imagenet: the window (decode_and_crop_jpeg); in tf.map_fn
    resize    to 224x224 float32 (data.augment.resize), stacked into the batch
    flip      imagenet: the random flip
    scale     to [0, 1]: the pipeline towerflow runs

and, in the same turns, (a) of `python -m benchmarks --input`: `tf.io.decode_jpeg` alone on the bytes in memory.
"""

from __future__ import annotations

import statistics
import sys
import tempfile

import tensorflow as tf

from benchmarks import input_figures, input_only, input_pipelines
from data import augment as augment_lib
from data import order, parse, schema
from data.integrity import BadRecords

IMAGE_SIZE = (224, 224)
STAGES = {
    "none": ("read", "shuffle", "parse", "key", "decode", "resize", "scale"),
    "imagenet": ("read", "shuffle", "parse", "key", "window", "decode", "resize", "flip", "scale"),
}
REFERENCE = ("reference", "decode_jpeg alone")
_REF = (REFERENCE[0], REFERENCE[1:])
_SPEC = {
    schema.IMAGE_ENCODED_KEY: tf.io.FixedLenFeature([], tf.string),
    schema.IMAGE_LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
}


def _records(info, shuffled: bool, batch_size: int) -> tf.data.Dataset:
    bad_records = BadRecords()
    bad_records.register(info, None, True)
    share = order.training_share(info.files, 0, 1)
    if shuffled:
        records = order.training_records(share, 0, 10_000, bad_records.chunk_reader(info), (0, 0))
        return order.position_batches(records, batch_size, True)
    files = tf.data.Dataset.from_tensor_slices(share[0]).repeat()
    records = files.interleave(bad_records.chunk_reader(info), num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    return records.batch(batch_size, drop_remainder=True).map(lambda r: (tf.zeros([batch_size, 2], tf.int64), r))


def _image(augment: str, upto: set[str]):
    """`image(encoded, key)`: one example's stages in `upto`; a pixel of the decoded image before resize."""

    def image(encoded, key):
        window = tf.zeros([4], tf.int32)
        if "window" in upto:
            window = augment_lib.random_window(key)(tf.image.extract_jpeg_shape(encoded))
        if "decode" not in upto:
            return tf.cast(window[:1], tf.float32)
        if augment == "imagenet":
            decoded = augment_lib.decode_crop(encoded, lambda shape: window, 3)
        else:
            decoded = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        if "resize" not in upto:
            return tf.cast(decoded[0, 0, :1], tf.float32)
        resized = augment_lib.resize(decoded, IMAGE_SIZE)
        resized = augment_lib.flip(resized, key) if "flip" in upto else resized
        return resized / 255.0 if "scale" in upto else resized

    return image


def pipeline(info, augment: str, last: str, batch_size: int) -> tf.data.Dataset:
    """towerflow's pipeline for `augment` up to stage `last` (a name in STAGES[augment])."""
    upto = set(STAGES[augment][: STAGES[augment].index(last) + 1])
    image = _image(augment, upto)
    base = augment_lib.stream_key(0, 0)

    def stages(positions, records):
        if "parse" not in upto:
            return records
        example = tf.io.parse_example(records, _SPEC)
        labels = parse._labels(example[schema.IMAGE_LABEL_KEY], 0, input_only.NUM_CLASSES)
        encoded = example[schema.IMAGE_ENCODED_KEY]
        if "key" not in upto:
            return encoded, labels
        keys = augment_lib.example_keys(base, positions)
        if "window" not in upto and "decode" not in upto:
            return keys, labels
        return tf.map_fn(lambda a: image(*a), (encoded, keys), fn_output_signature=tf.float32, parallel_iterations=32)

    batches = _records(info, last != "read", batch_size).map(stages, num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE).with_options(input_pipelines.thread_options(True))


def measure(pattern: str, size: input_only.InputSize, rounds: int) -> dict[str, list[tuple[str, float]]]:
    """{augment: [(stage, microseconds of a core per image of the pipeline up to it)]}, medians of `rounds`;
    augment "reference": (a) of `python -m benchmarks --input`, decode_jpeg alone on the bytes in memory."""
    import data

    info = data.inspect_records(pattern, data.ImageSchema(image_size=IMAGE_SIZE))
    names = [(augment, stage) for augment, stages in STAGES.items() for stage in stages]
    datasets = {(augment, stage): pipeline(info, augment, stage, size.batch_size) for augment, stage in names}
    encoded = input_pipelines.load_encoded(pattern)
    datasets[REFERENCE] = input_pipelines.build("decode", pattern, encoded, size.batch_size, True)
    names.append(REFERENCE)
    windows = input_figures.warm_windows(datasets, size)
    costs = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            seconds, images = windows[name](size.batches_per_window)
            costs[name].append(1e6 * seconds / images)
    return {a: [(s, statistics.median(costs[a, s])) for s in stages] for a, stages in (*STAGES.items(), _REF)}


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 5
    size = input_only.SIZES["full"]
    with tempfile.TemporaryDirectory(prefix="towerflow-input-stages-") as work_dir:
        pattern = input_only.write_jpegs(work_dir, size.num_records)
        table = measure(pattern, size, rounds)
    (_, reference), *_ = table.pop(REFERENCE[0])
    print(f"(a) tf.io.decode_jpeg alone, bytes in memory (python -m benchmarks --input): {reference:.1f} us/image")
    for augment, rows in table.items():
        print(f"--augment={augment}: stage, us/image of the pipeline up to it, the stage's own cost")
        previous = 0.0
        for stage, us in rows:
            print(f"  {stage:<8} {us:8.1f} {us - previous:+8.1f}")
            previous = us
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
