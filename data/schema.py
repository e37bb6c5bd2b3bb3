"""Record schemas: which tf.train.Example keys hold the features and labels.

This module imports neither TensorFlow nor numpy, so flag validation can use it before the slow imports.
"""

from __future__ import annotations

import dataclasses
import numbers

# Keys written by TensorFlow's ImageNet conversion script (build_imagenet_data.py).
# A TFRecord frames each record with its length (8 bytes) and two CRCs (4 each): a file's bytes are the
# records' plus this much per record.
FRAME_BYTES = 16
IMAGE_ENCODED_KEY = "image/encoded"
IMAGE_LABEL_KEY = "image/class/label"
IMAGE_HEIGHT_KEY = "image/height"
IMAGE_WIDTH_KEY = "image/width"
IMAGE_CHANNELS_KEY = "image/channels"
IMAGE_FORMAT_KEY = "image/format"
IMAGE_COLORSPACE_KEY = "image/colorspace"


class DataError(ValueError):
    """Bad input data or arguments; the message names the file, key or value and what to change."""


@dataclasses.dataclass(frozen=True)
class ImageSchema:
    """Records as TensorFlow's ImageNet conversion scripts write them (build_imagenet_data.py).

    Keys: image/encoded (JPEG or PNG bytes), image/class/label (int64), and optionally image/height,
    image/width, image/channels (int64).

    Attributes:
        label_offset: Subtracted from every label (ImageNet labels start at 1, so pass 1 there).
        image_size: (H, W) to resize every image to (bilinear). If None, every image must have the shape
            of the first record.
    """

    label_offset: int = 0
    image_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.image_size is not None:
            size = tuple(self.image_size)
            if len(size) != 2 or not all(isinstance(v, numbers.Integral) and v > 0 for v in size):
                raise DataError(f"image_size {self.image_size!r} must be two positive ints (H, W)")
            # Frozen dataclass: normalise lists and numpy ints so the schema stays hashable and printable.
            object.__setattr__(self, "image_size", (int(size[0]), int(size[1])))

    @property
    def label_key(self) -> str:
        """The int64 label feature's key."""
        return IMAGE_LABEL_KEY


@dataclasses.dataclass(frozen=True)
class DenseSchema:
    """Records holding a fixed-length float feature vector and an int64 label.

    Attributes:
        feature_key: Key of the float_list feature vector; every record has the same length.
        label_key: Key of the int64 label.
        label_offset: Subtracted from every label.
    """

    feature_key: str = "features"
    label_key: str = "label"
    label_offset: int = 0


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """How decoded images become model inputs (`data.augment`): pixels in [0, 1], augmented in training, then
    `(x - mean) / std` per channel when `mean` is given.

    Attributes:
        augment: "none", "flip", "crop_flip" or "imagenet" (see data.augment); eval is never random.
        mean: Per-channel means on [0, 1] pixels (one value: every channel); None: no normalization.
        std: Per-channel standard deviations, as many as `mean`, each > 0.
    """

    augment: str = "none"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.augment not in ("none", "flip", "crop_flip", "imagenet"):
            raise DataError(f"augment {self.augment!r} must be none, flip, crop_flip or imagenet")
        if (self.mean is None) != (self.std is None) or (self.mean is not None and len(self.mean) != len(self.std)):
            raise DataError(f"mean {self.mean} and std {self.std} must both be given, one value per channel each")
        if self.std is not None and min(self.std) <= 0:
            raise DataError(f"std {self.std} must be positive")


_FEATURE_DTYPES = ("int64", "float32", "string")


@dataclasses.dataclass(frozen=True)
class Feature:
    """One key of a task's tf.train.Examples (`tasks.Task.features`).

    Attributes:
        dtype: "int64", "float32" or "string" (bytes).
        shape: The shape of one example's value when it has a fixed length; () is a scalar.
        max_length: > 0 makes it a variable-length list of up to this many values (shape must be ()): padded
            with `pad` to a length from `buckets`, its true length in the batch as `<key>_length`. A longer
            record fails the run, naming the feature and the file.
        pad: The value padding positions hold.
        buckets: The padded lengths a batch may have, ascending, the last `max_length`: a batch is padded to
            the smallest that holds its longest example, so at most len(buckets) shapes are ever traced.
            Empty: powers of two from 8, then `max_length`.
        optional: A record may lack the key: it then reads as an empty list. Only a variable-length feature
            can be optional (a fixed one has no value to read instead). Not optional: a record without the key
            fails the run, naming the task, the feature, the file and the keys the record has.
        bounds: (low, high): every value v must satisfy low <= v < high (int64 or float32 only), checked in
            the input pipeline before the model sees it, e.g. (0, vocab_size) for token ids. None: unchecked.
    """

    dtype: str
    shape: tuple[int, ...] = ()
    max_length: int = 0
    pad: float = 0
    buckets: tuple[int, ...] = ()
    optional: bool = False
    bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.dtype not in _FEATURE_DTYPES:
            raise DataError(f"feature dtype {self.dtype!r} must be one of {', '.join(_FEATURE_DTYPES)}")
        shape = tuple(self.shape)
        if not all(isinstance(d, numbers.Integral) and d > 0 for d in shape):
            raise DataError(f"feature shape {self.shape!r} must be positive ints")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if self.max_length < 0 or (self.max_length and shape):
            raise DataError(f"a variable-length feature (max_length {self.max_length}) has shape (), not {shape}")
        buckets = tuple(int(b) for b in self.buckets) or _default_buckets(self.max_length)
        if self.max_length and (list(buckets) != sorted(set(buckets)) or buckets[-1] != self.max_length):
            raise DataError(f"buckets {buckets} must ascend and end at max_length {self.max_length}")
        object.__setattr__(self, "buckets", buckets if self.max_length else ())
        if self.optional and not self.max_length:
            raise DataError(
                "a fixed feature cannot be optional (it has no value to read when absent): give it max_length "
                "to read a missing key as an empty list, or write the key in every record"
            )
        if self.bounds is not None:
            object.__setattr__(self, "bounds", _checked_bounds(self.dtype, self.bounds))

    @property
    def variable(self) -> bool:
        """Whether the feature is a variable-length list (padded per batch)."""
        return self.max_length > 0


def _checked_bounds(dtype: str, bounds) -> tuple[float, float]:
    """`bounds` as (low, high) of the feature's dtype (ints for int64), or a DataError saying what is wrong."""
    if dtype == "string":
        raise DataError(f"bounds {bounds!r}: only an int64 or float32 feature has bounds, not a string one")
    pair = tuple(bounds) if isinstance(bounds, (tuple, list)) else ()
    numbers_ok = len(pair) == 2 and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in pair)
    if numbers_ok and dtype == "int64" and not all(float(v).is_integer() for v in pair):
        numbers_ok = False
    if not numbers_ok or not pair[0] < pair[1]:
        kind = "ints" if dtype == "int64" else "numbers"
        raise DataError(f"bounds {bounds!r} must be two {kind} (low, high) with low < high: low <= value < high")
    convert = int if dtype == "int64" else float
    return convert(pair[0]), convert(pair[1])


def _default_buckets(max_length: int) -> tuple[int, ...]:
    if not max_length:
        return ()
    lengths, n = [], 8
    while n < max_length:
        lengths.append(n)
        n *= 2
    return (*lengths, max_length)


@dataclasses.dataclass(frozen=True)
class FeatureSchema:
    """A task's records: its features by key (`tasks.Task.features`), and the task's name for messages."""

    features: tuple[tuple[str, Feature], ...]
    task: str = "task"

    @classmethod
    def of(cls, features: dict[str, Feature], task: str) -> FeatureSchema:
        if not features or not all(isinstance(f, Feature) for f in features.values()):
            raise DataError(f"task {task!r}: features() must return a non-empty {{key: data.Feature}} dict")
        return cls(tuple(sorted(features.items())), task)

    def as_dict(self) -> dict[str, Feature]:
        return dict(self.features)


@dataclasses.dataclass(frozen=True)
class RecordInfo:
    """What `inspect_records` learned from the first record; the input of `make_dataset`.

    Attributes:
        schema: The schema, resolved (auto-detection fills in the kind).
        example_shape: (H, W, C) for images (after image_size), (D,) for dense records, () for a task's
            feature records.
        files: The sorted files that matched the pattern.
    """

    schema: ImageSchema | DenseSchema | FeatureSchema
    example_shape: tuple[int, ...]
    files: tuple[str, ...]
