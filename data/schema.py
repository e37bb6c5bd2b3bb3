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


@dataclasses.dataclass(frozen=True)
class RecordInfo:
    """What `inspect_records` learned from the first record; the input of `make_dataset`.

    Attributes:
        schema: The schema, resolved (auto-detection fills in the kind).
        example_shape: (H, W, C) for images (after image_size), (D,) for dense records.
        files: The sorted files that matched the pattern.
    """

    schema: ImageSchema | DenseSchema
    example_shape: tuple[int, ...]
    files: tuple[str, ...]
