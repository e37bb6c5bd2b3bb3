"""Tests of image augmentation, normalization and the decoded cache (data/augment.py, data/cache.py), and of
how the trainer resolves --augment, --normalize and --cache (trainer/loop/inputs.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import data
from data import augment
from tests.support.records import _images
from trainer.loop import inputs as inputs_lib
from trainer.settings import config as cfg
from trainer.settings import preprocess
from trainer.settings.resolve import resolve


def _smooth_images(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth RGB images (JPEG keeps them close) that differ from their mirror image."""
    y, x = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    rng = np.random.default_rng(seed)
    images = [np.stack([x * rng.uniform(50, 255), y * rng.uniform(50, 255), (x * y) * 255], -1) for _ in range(n)]
    return np.stack(images).astype(np.uint8)


def _records(tmp_path, image_format="png", n=48, size=(32, 32), num_shards=3, image_size=None):
    images = _smooth_images(n, *size) if image_format == "jpeg" else _images(n, *size, 3)
    data.write_image_records(
        str(tmp_path / "img"), images, np.arange(n) % 10, num_shards=num_shards, image_format=image_format
    )
    return data.inspect_records(str(tmp_path / "img-*"), data.ImageSchema(image_size=image_size)), images


def _batches(info, preprocess=None, cache=False, n=6, batch_size=8, resume_from=None, seed=0):
    decoded = data.decode_share(info, num_classes=10) if cache else None
    dataset = data.make_dataset(
        info, batch_size=batch_size, training=True, seed=seed, num_classes=10, preprocess=preprocess, cache=decoded,
        resume_from=resume_from,
    )  # fmt: skip
    return [tuple(t.numpy() for t in batch) for batch in dataset.take(n)]


def _key(*position):
    return augment.example_key(augment.stream_key(0, 0), tf.constant(position, tf.int64))


# Augmentations: shapes, ranges, keyed on position.


@pytest.mark.parametrize("name", ["flip", "crop_flip", "imagenet"])
def test_augmented_batches_keep_shape_and_range(tmp_path, name):
    info, _ = _records(tmp_path)
    plain = _batches(info)
    augmented = _batches(info, data.Preprocess(name))
    for (_, y), (ax, ay) in zip(plain, augmented, strict=True):
        assert ax.shape == (8, 32, 32, 3) and ax.dtype == np.float32
        assert ax.min() >= 0.0 and ax.max() <= 1.0
        np.testing.assert_array_equal(ay, y)  # same examples, same order: only their pixels change
    changed = [not np.array_equal(x, ax) for (x, _), (ax, _) in zip(plain, augmented, strict=True)]
    assert all(changed)


def test_flip_is_the_image_or_its_mirror_and_keyed_on_position():
    image = tf.constant(_images(1, 6, 5, 3)[0], tf.float32)
    outputs = [augment.randomize(image, "flip", _key(0, i)).numpy() for i in range(32)]
    flipped = [np.array_equal(out, image.numpy()[:, ::-1]) for out in outputs]
    assert all(f or np.array_equal(out, image.numpy()) for f, out in zip(flipped, outputs, strict=True))
    assert 8 <= sum(flipped) <= 24  # about half
    again = [augment.randomize(image, "flip", _key(0, i)).numpy() for i in range(32)]
    assert all(np.array_equal(a, b) for a, b in zip(outputs, again, strict=True))


def _crop_offset(out: np.ndarray, image: np.ndarray, pad: int) -> tuple[int, int]:
    """The (y, x) at which `out` is a crop of `image` zero-padded by `pad` pixels; fails if it is none."""
    padded = np.pad(image, [(pad, pad), (pad, pad), (0, 0)])
    height, width = image.shape[:2]
    offsets = [
        (y, x)
        for y in range(2 * pad + 1)
        for x in range(2 * pad + 1)
        if np.array_equal(padded[y : y + height, x : x + width], out)
    ]
    assert len(offsets) == 1, f"not one crop of the {pad}-pixel padded image: {offsets}"
    return offsets[0]


def test_crop_flip_pads_an_eighth_and_is_keyed_on_position():
    image = np.arange(32 * 32, dtype=np.float32).reshape(32, 32, 1) + 1  # every pixel unique, none 0
    offsets = [_crop_offset(augment.pad_and_crop(tf.constant(image), _key(0, i)).numpy(), image, 4) for i in range(200)]
    # 4 = 32/8 pixels of zeros on each side: every offset 0..8 on each axis occurs, none beyond
    assert {y for y, _ in offsets} == set(range(9)) and {x for _, x in offsets} == set(range(9))
    assert _crop_offset(augment.pad_and_crop(tf.constant(image), _key(0, 3)).numpy(), image, 4) == offsets[3]
    digit = np.arange(64, dtype=np.float32).reshape(8, 8, 1) + 1
    digit_offsets = {
        _crop_offset(augment.pad_and_crop(tf.constant(digit), _key(0, i)).numpy(), digit, 1) for i in range(50)
    }
    assert {y for y, _ in digit_offsets} == {0, 1, 2}  # pad 1 on the 8x8 digits
    # crop_flip: a crop, then the crop or its mirror; the same position gives the same image, epochs differ
    for e in range(2):
        for i in range(20):
            out = augment.randomize(tf.constant(image), "crop_flip", _key(e, i)).numpy()
            crop = augment.pad_and_crop(tf.constant(image), _key(e, i)).numpy()
            assert np.array_equal(out, crop) or np.array_equal(out, crop[:, ::-1])
    outputs = {
        augment.randomize(tf.constant(image), "crop_flip", _key(e, i)).numpy().tobytes()
        for e in range(2)
        for i in range(20)
    }
    assert len(outputs) > 30  # 81 offsets x 2 flips: different positions, different crops


def test_example_keys_match_example_key():
    base = augment.stream_key(7, 3)
    positions = tf.constant([[0, 5], [0, 6], [1, 1], [1, 2], [2, 9]], tf.int64)
    expected = [augment.example_key(base, p).numpy() for p in positions]
    np.testing.assert_array_equal(augment.example_keys(base, positions).numpy(), expected)
    assert len({tuple(k) for k in expected}) == 5
    assert not np.array_equal(augment.stream_key(7, 3).numpy(), augment.stream_key(7, 4).numpy())


def test_same_position_gives_the_same_example_after_a_resume(tmp_path):
    info, _ = _records(tmp_path, num_shards=2)
    preprocess = data.Preprocess("crop_flip")
    full = _batches(info, preprocess, n=9, resume_from=(0, 0))
    resumed = _batches(info, preprocess, n=5, resume_from=tuple(full[3][2]))  # 4 batches in: crosses an epoch
    assert full[8][2][0] == 1  # the last batch is in the second epoch
    for a, b in zip(full[4:], resumed, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
    # The same records in another epoch are other positions: other crops and flips.
    assert not np.array_equal(_batches(info, preprocess, n=1, seed=1)[0][0], full[0][0])


# The ImageNet recipe: crop decoding and the eval center crop.


@pytest.mark.parametrize("chroma_downsampling", [True, False])  # 4:2:0 chroma, as most JPEGs; 4:4:4
def test_decode_and_crop_jpeg_equals_decode_then_crop(chroma_downsampling):
    noise = np.random.default_rng(0).integers(-30, 30, size=(4, 60, 44, 3))
    images = np.clip(_smooth_images(4, 60, 44) + noise, 0, 255).astype(np.uint8)
    encoded = [tf.io.encode_jpeg(image, quality=90, chroma_downsampling=chroma_downsampling) for image in images]
    rng = np.random.default_rng(1)
    for i, one in enumerate(encoded):
        whole = tf.io.decode_image(one, channels=3, expand_animations=False)
        # Random-resized-crop windows, and windows of any size at any offset (edges off and on MCU boundaries).
        windows = [augment.random_window(_key(i, position)) for position in range(12)]
        for _ in range(40):
            h, w = rng.integers(1, 61), rng.integers(1, 45)
            window = tf.constant([rng.integers(0, 61 - h), rng.integers(0, 45 - w), h, w], tf.int32)
            windows.append(lambda shape, window=window: window)
        for window_of in windows:
            cropped = augment.decode_crop(one, window_of, 3)
            expected = augment.crop(whole, window_of(tf.shape(whole)))
            assert cropped.dtype == tf.uint8 and 0 < cropped.shape[0] <= 60 and 0 < cropped.shape[1] <= 44
            np.testing.assert_array_equal(cropped.numpy(), expected.numpy())


def test_random_windows_follow_the_area_and_aspect_ranges():
    shape = tf.constant([300, 400, 3])
    windows = np.array([augment.random_window(_key(0, i))(shape).numpy() for i in range(200)])
    y, x, h, w = windows.T
    assert (y >= 0).all() and (x >= 0).all() and (y + h <= 300).all() and (x + w <= 400).all()
    area = h * w / (300 * 400)
    assert area.min() >= 0.08 - 0.01 and area.max() <= 1.0
    ratio = w / h
    full = area == 1.0  # the fallback after 10 failed attempts: the whole image
    assert (ratio[~full] >= 0.75 - 0.02).all() and (ratio[~full] <= 4 / 3 + 0.02).all()
    assert len({tuple(v) for v in windows}) > 150


def test_eval_center_crop(tmp_path):
    info, images = _records(tmp_path, n=4, size=(40, 48), num_shards=1)
    np.testing.assert_array_equal(augment.center_window(tf.constant([40, 48, 3])).numpy(), [2, 3, 35, 42])
    dataset = data.make_dataset(info, batch_size=4, training=False, preprocess=data.Preprocess("imagenet"))
    (features, _), *_ = list(dataset)
    assert features.shape == (4, 40, 48, 3)
    expected = tf.image.resize(images[:, 2:37, 3:45, :], (40, 48), method="bilinear").numpy() / 255.0
    np.testing.assert_allclose(features.numpy(), expected, rtol=0, atol=1e-6)
    again = list(data.make_dataset(info, batch_size=4, training=False, preprocess=data.Preprocess("imagenet")))
    np.testing.assert_array_equal(again[0][0].numpy(), features.numpy())  # eval is never random


def test_imagenet_training_output_is_resized_crops(tmp_path):
    info, _ = _records(tmp_path, image_format="jpeg", n=16, size=(60, 44), image_size=(24, 24))
    (x, _, _), *_ = _batches(info, data.Preprocess("imagenet"), n=1, resume_from=(0, 0))
    assert x.shape == (8, 24, 24, 3) and x.min() >= 0 and x.max() <= 1


def test_normalize_after_augmentation(tmp_path):
    info, _ = _records(tmp_path)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    plain = _batches(info, data.Preprocess("crop_flip"), n=2)
    normalized = _batches(info, data.Preprocess("crop_flip", mean, std), n=2)
    for (x, _), (nx, _) in zip(plain, normalized, strict=True):
        np.testing.assert_allclose(nx, (x - np.array(mean, np.float32)) / np.array(std, np.float32), rtol=1e-6)
    (ex, _), *_ = list(
        data.make_dataset(info, batch_size=8, training=False, preprocess=data.Preprocess("none", mean, std))
    )
    assert ex.numpy().min() < 0  # eval is normalized too


# The decoded cache.


@pytest.mark.parametrize(
    ("image_format", "name", "image_size"),
    [("png", "none", None), ("png", "crop_flip", None), ("jpeg", "imagenet", (24, 24)), ("png", "flip", (20, 16))],
)
def test_cache_gives_the_same_batches(tmp_path, image_format, name, image_size):
    info, _ = _records(tmp_path, image_format=image_format, size=(32, 28), image_size=image_size)
    preprocess = data.Preprocess(name)
    uncached = _batches(info, preprocess, n=14, resume_from=(0, 0))  # 112 examples: over two epochs of 48
    cached = _batches(info, preprocess, cache=True, n=14, resume_from=(0, 0))
    for a, b in zip(uncached, cached, strict=True):
        for u, c in zip(a, b, strict=True):
            np.testing.assert_array_equal(u, c)
    resumed = _batches(info, preprocess, cache=True, n=3, resume_from=tuple(uncached[7][2]))
    np.testing.assert_array_equal(resumed[0][0], uncached[8][0])


def test_cache_holds_the_workers_records_decoded(tmp_path):
    info, images = _records(tmp_path, n=12, num_shards=3)
    decoded = data.decode_share(info, worker_index=1, num_workers=3, num_classes=10)
    assert decoded.files == (info.files[1],) and decoded.counts == (4,)
    np.testing.assert_array_equal(decoded.images.numpy(), images[4:8])
    np.testing.assert_array_equal(decoded.labels.numpy(), np.arange(4, 8) % 10)


def test_cache_refuses_images_of_several_sizes_without_image_size(tmp_path):
    data.write_image_records(str(tmp_path / "a"), _images(2, 8, 8, 1), np.array([0, 1]))
    data.write_image_records(str(tmp_path / "b"), _images(2, 9, 8, 1), np.array([0, 1]))
    info = data.inspect_records(f"{tmp_path}/a-*,{tmp_path}/b-*")
    with pytest.raises(data.DataError, match="is not 8x8x1 like the first record"):
        data.decode_share(info)
    resized = data.inspect_records(f"{tmp_path}/a-*,{tmp_path}/b-*", data.ImageSchema(image_size=(8, 8)))
    assert data.decode_share(resized).images is None  # kept at their stored sizes, resized after the cache


# Flags and their resolution.


def test_normalization_values():
    assert not cfg.Normalization.parse("none") and cfg.Normalization.parse("none").text == "none"
    assert cfg.Normalization.parse("imagenet") == cfg.Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert cfg.Normalization.parse("0.5,0.25") == cfg.Normalization((0.5,), (0.25,))
    assert cfg.Normalization.parse("1,2,3,4,5,6") == cfg.Normalization((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
    for bad, match in [("0.5", "MEAN,STD"), ("a,b", "MEAN,STD"), ("0.5,0", "std must be positive"), ("", "MEAN")]:
        with pytest.raises(cfg.ConfigError, match=match):
            cfg.Normalization.parse(bad)
    with pytest.raises(cfg.ConfigError, match="--augment"):
        resolve(cfg.RunConfig(data=cfg.DataConfig(augment="mixup")))
    with pytest.raises(cfg.ConfigError, match="--cache"):
        resolve(cfg.RunConfig(data=cfg.DataConfig(cache="disk")))


def _inputs(tmp_path, dense=False, channels=3):
    if dense:
        data.write_dense_records(str(tmp_path / "d"), np.ones([4, 3], np.float32), np.arange(4))
        info = data.inspect_records(str(tmp_path / "d-*"))
    else:
        data.write_image_records(str(tmp_path / "i"), _images(4, 8, 8, channels), np.arange(4))
        info = data.inspect_records(str(tmp_path / "i-*"))
    return inputs_lib.Inputs(info, info, 4)


@pytest.mark.parametrize(
    ("model", "expected"),
    [("resnet20", "crop_flip"), ("resnet50", "imagenet"), ("cnn", "none"), ("mlp", "none"), ("my.mod:fn", "none")],
)
def test_auto_augment_by_model(tmp_path, model, expected):
    config = cfg.RunConfig(model=cfg.ModelConfig(model))
    assert preprocess.preprocessing(resolve(config), _inputs(tmp_path).train) == data.Preprocess(expected)


def test_dense_records_are_not_augmented_or_normalized(tmp_path):
    inputs = _inputs(tmp_path, dense=True)
    assert (
        preprocess.preprocessing(resolve(cfg.RunConfig(model=cfg.ModelConfig("resnet20"))), inputs.train)
        == data.Preprocess()
    )
    for flag in [{"augment": "flip"}, {"normalize": cfg.Normalization.parse("0.5,0.2")}]:
        config = cfg.RunConfig(data=cfg.DataConfig(**flag))
        with pytest.raises(cfg.ConfigError, match="dense records"):
            preprocess.preprocessing(resolve(config), inputs.train)
    assert not preprocess.use_cache(cfg.DataConfig(cache="memory"), inputs.train)


def test_normalize_values_per_channel(tmp_path):
    gray = _inputs(tmp_path, channels=1)
    config = cfg.RunConfig(data=cfg.DataConfig(normalize=cfg.Normalization.parse("0.5,0.25")))
    assert preprocess.preprocessing(resolve(config), gray.train) == data.Preprocess("none", (0.5,), (0.25,))
    rgb = _inputs(tmp_path / "rgb")
    assert preprocess.preprocessing(resolve(config), rgb.train) == data.Preprocess("none", (0.5,) * 3, (0.25,) * 3)
    with pytest.raises(cfg.ConfigError, match="the images have 1 channel"):
        preprocess.preprocessing(
            resolve(dataclasses.replace(config, data=cfg.DataConfig(normalize=cfg.Normalization.parse("imagenet")))),
            gray.train,
        )


def test_auto_cache_below_the_bound(tmp_path, monkeypatch):
    inputs = _inputs(tmp_path)
    assert data.estimated_bytes(inputs.train) == 4 * 8 * 8 * 3
    assert preprocess.use_cache(cfg.DataConfig(), inputs.train)
    assert not preprocess.use_cache(cfg.DataConfig(cache="none"), inputs.train)
    monkeypatch.setattr(data, "AUTO_CACHE_BYTES", 100)
    assert not preprocess.use_cache(cfg.DataConfig(), inputs.train)
    assert preprocess.use_cache(cfg.DataConfig(cache="memory"), inputs.train)


def test_data_settings_resolve_auto_and_say_why(tmp_path, monkeypatch):
    inputs = _inputs(tmp_path)  # 4 RGB 8x8 images: 768 bytes decoded
    settings = preprocess.data_settings(resolve(cfg.RunConfig(model=cfg.ModelConfig("resnet20"))), inputs.train)
    assert (
        settings.describe("resnet20")
        == "crop_flip (auto for resnet20), normalize none, cache memory (auto: ~768 bytes decoded)"
    )
    assert settings.metrics() == {
        "augment": "crop_flip",
        "normalize": "none",
        "cache": "memory",
        "cache_decoded_bytes": 768,
    }
    explicit = cfg.RunConfig(
        data=cfg.DataConfig(
            augment="flip", normalize=cfg.Normalization.parse("0.5,0.5,0.5,0.25,0.25,0.25"), cache="none"
        )
    )
    settings = preprocess.data_settings(resolve(explicit), inputs.train)
    assert settings.describe("cnn") == "flip, normalize 0.5,0.25, cache none"
    assert settings.preprocess == data.Preprocess("flip", (0.5,) * 3, (0.25,) * 3)
    monkeypatch.setattr(data, "AUTO_CACHE_BYTES", 100)
    assert (
        preprocess.data_settings(resolve(cfg.RunConfig()), inputs.train)
        .describe("cnn")
        .endswith("cache none (auto: ~768 bytes decoded, over the 9.31323e-08 GiB bound)")
    )
    dense = preprocess.data_settings(resolve(cfg.RunConfig()), _inputs(tmp_path / "dense", dense=True).train)
    assert dense.describe("mlp") == "none (auto for mlp), normalize none, cache none (auto: dense records)"


def test_normalization_is_one_spelling_per_normalization():
    def text(value):
        return cfg.Normalization.parse(value).text

    assert text("none") == "none"
    assert text("0.485,0.456,0.406,0.229,0.224,0.225") == "imagenet"
    assert text("0.5,0.5,0.25,0.25") == text("0.5,0.25") == "0.5,0.25"
    assert text("1,2,3,4,5,6") == "1.0,2.0,3.0,4.0,5.0,6.0"
