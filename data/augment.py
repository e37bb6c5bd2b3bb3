"""Per-example image preprocessing: decode (only the crop, for JPEG random-resized crops), augment, normalize.

Randomness is stateless and keyed on the example's position in the run: (seed, input stream, epoch, record
index), the position the training pipeline (`data.order.training_records`) already carries for exact resumes.
So what an example looks like depends on neither the towers, the machines, the parallelism of the map, nor a
kill and resume.

Augmentations (training only; eval is never random):
- flip: random horizontal flip.
- crop_flip: zero-pad H/8 x W/8 pixels (4 for 32x32, the CIFAR recipe; at least 1), a random HxW crop, flip.
- imagenet: random-resized crop (area [0.08, 1] of the image, aspect ratio [3/4, 4/3], 10 attempts, else the
  whole image), decoding only the crop of a JPEG, resized (bilinear) to HxW, flip. Eval: the central 87.5%
  of each side, resized to HxW.
"""

from __future__ import annotations

import tensorflow as tf

AUGMENTS = ("none", "flip", "crop_flip", "imagenet")
CROP_AREA_RANGE = (0.08, 1.0)
CROP_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10
EVAL_CROP_FRACTION = 0.875
# Pixels decoded around a JPEG crop window (see decode_crop): 1 is enough for the pixels of a whole decode,
# 2 leaves one of slack. 16 (one MCU at 4:2:0) was used until 2026-11: the same pixels, ~4% more decoding.
_JPEG_MARGIN = 2
# Salts the stream's key so augmentation seeds never coincide with the reader's shuffle seeds.
_AUGMENT_SALT = 0x61756700


def stream_key(seed: int, stream: int) -> tf.Tensor:
    """The base key of input stream `stream`: int64 [2]."""
    return tf.random.experimental.stateless_fold_in(tf.constant([seed, _AUGMENT_SALT], tf.int64), stream)


def example_key(base: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    """The stateless seed of the example at `position` = (epoch, record index) of the stream keyed `base`."""
    return tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(base, position[0]), position[1]
    )


def example_keys(base: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
    """`example_key` of every row of `positions` [B, 2], int64 [B, 2]: one draw per distinct epoch of the
    batch (one or two) instead of one per example."""
    epochs, which = tf.unique(positions[:, 0])
    epoch_keys = tf.map_fn(
        lambda epoch: tf.random.experimental.stateless_fold_in(base, epoch), epochs, fn_output_signature=tf.int64
    )
    # fold_in(seed, data) = [a draw keyed on seed, data], so the second fold-in's draw is keyed on epoch_keys.
    draws = tf.map_fn(
        lambda key: tf.random.stateless_uniform([], key, minval=None, maxval=None, dtype=tf.int64),
        epoch_keys,
        fn_output_signature=tf.int64,
    )
    return tf.stack([tf.gather(draws, which), positions[:, 1]], axis=1)


def _subkey(key: tf.Tensor, use: int) -> tf.Tensor:
    return tf.random.experimental.stateless_fold_in(key, use)


def random_window(key: tf.Tensor):
    """`window(image_shape) -> [y, x, h, w]`: a random-resized-crop window keyed on `key`."""

    def window(shape: tf.Tensor) -> tf.Tensor:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.cast(shape, tf.int32),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            seed=_subkey(key, 0),
            min_object_covered=CROP_AREA_RANGE[0],
            aspect_ratio_range=CROP_ASPECT_RATIO_RANGE,
            area_range=CROP_AREA_RANGE,
            max_attempts=CROP_ATTEMPTS,
            use_image_if_no_bounding_boxes=True,
        )
        return tf.stack([begin[0], begin[1], size[0], size[1]])

    return window


def center_window(shape: tf.Tensor) -> tf.Tensor:
    """[y, x, h, w] of the central EVAL_CROP_FRACTION of each side of an image of `shape`."""
    hw = tf.cast(shape[:2], tf.int32)
    size = tf.maximum(tf.cast(tf.cast(hw, tf.float32) * EVAL_CROP_FRACTION, tf.int32), 1)
    offset = (hw - size) // 2
    return tf.concat([offset, size], axis=0)


def crop(image: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """The [y, x, h, w] window of a decoded [H, W, C] image."""
    return tf.slice(image, tf.stack([window[0], window[1], 0]), tf.stack([window[2], window[3], -1]))


def decode_crop(encoded: tf.Tensor, window_of, channels: int) -> tf.Tensor:
    """Decodes the window `window_of(shape)` of one image: a JPEG through `decode_and_crop_jpeg` (only the
    window and a 2-pixel margin are decoded), anything else (PNG) whole, then cropped. uint8 [h, w, C]."""

    def jpeg():
        shape = tf.image.extract_jpeg_shape(encoded)
        window = window_of(shape)
        # Chroma upsampling reads a pixel's neighbouring chroma sample: decoding exactly the window changes
        # its left and right edge pixels (by up to 3 levels; libjpeg starts a cropped row at an MCU boundary
        # and upsamples it as if the image began there). A margin of one pixel keeps the window's pixels
        # away from that boundary, so decoding the window and a 2-pixel margin and cropping gives the pixels
        # of the whole-image decode, bit for bit (tests/data/test_augment.py: 4:2:0 and 4:4:4), and cached and
        # uncached runs agree. Rows need no margin (libjpeg reads the context rows itself): one costs little.
        begin = tf.maximum(window[:2] - _JPEG_MARGIN, 0)
        end = tf.minimum(window[:2] + window[2:] + _JPEG_MARGIN, shape[:2])
        decoded = tf.image.decode_and_crop_jpeg(encoded, tf.concat([begin, end - begin], 0), channels=channels)
        return crop(decoded, tf.concat([window[:2] - begin, window[2:]], 0))

    def other():
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        return crop(image, window_of(tf.shape(image)))

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def resize(image: tf.Tensor, size) -> tf.Tensor:
    """Bilinear resize of [H, W, C] to float32 [*size, C]. The pixels are cast to float32 first: TensorFlow's
    kernel computes in float32 either way (the same bits), but reads uint8 slowly; casting first costs ~35 us
    less of a core per 500x375 image resized to 224x224."""
    return tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear")


def pad_and_crop(image: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """Zero-pads H/8 and W/8 pixels (at least 1) on each side, then takes a random crop of the input's size."""
    height, width, channels = image.shape
    pad_h, pad_w = max(1, round(height / 8)), max(1, round(width / 8))
    padded = tf.pad(image, [[pad_h, pad_h], [pad_w, pad_w], [0, 0]])
    y = tf.random.stateless_uniform([], _subkey(key, 1), minval=0, maxval=2 * pad_h + 1, dtype=tf.int32)
    x = tf.random.stateless_uniform([], _subkey(key, 2), minval=0, maxval=2 * pad_w + 1, dtype=tf.int32)
    return tf.slice(padded, tf.stack([y, x, 0]), [height, width, channels])


def flip(image: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """Random horizontal flip, with probability 1/2."""
    return tf.image.stateless_random_flip_left_right(image, _subkey(key, 3))


def randomize(image: tf.Tensor, augment: str, key: tf.Tensor) -> tf.Tensor:
    """The random steps of `augment` that follow decoding and resizing (crop_flip's crop, every flip)."""
    if augment == "crop_flip":
        image = pad_and_crop(image, key)
    if augment in ("flip", "crop_flip", "imagenet"):
        image = flip(image, key)
    return image


def normalizer(mean: tuple[float, ...] | None, std: tuple[float, ...] | None):
    """`normalize(images in [0, 1]) -> (images - mean) / std` per channel; identity when mean is None."""
    if mean is None:
        return lambda images: images
    mean_t, std_t = tf.constant(mean, tf.float32), tf.constant(std, tf.float32)
    return lambda images: (images - mean_t) / std_t
