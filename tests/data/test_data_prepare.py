"""Tests of data/: the digits cache and `python -m data.prepare`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import data
from data import digits, prepare, synthetic
from tests.support.paths import ROOT
from tests.support.records import _collect, _count_records

pytestmark = pytest.mark.quick  # the development subset: fast, and covers this file's checks

# Digits and `python -m data.prepare`.


@pytest.fixture(scope="module")
def digits_globs(tmp_path_factory):
    return data.ensure_digits(str(tmp_path_factory.mktemp("cache") / "digits-v1"))


def test_ensure_digits_builds_the_fixed_split(digits_globs):
    train_glob, eval_glob = digits_globs
    assert (_count_records(train_glob), _count_records(eval_glob)) == (1437, 360)
    assert len(data.list_files(train_glob)) == 4 and len(data.list_files(eval_glob)) == 1
    info = data.inspect_records(eval_glob)
    assert info.example_shape == (8, 8, 1) and info.schema == data.ImageSchema()
    features, labels = _collect(data.make_dataset(info, batch_size=100, training=False))
    assert set(labels.tolist()) == set(range(digits.NUM_CLASSES))
    assert features.min() == 0.0 and features.max() == 1.0
    (_, _), (eval_images, eval_labels) = digits.digits_splits()
    np.testing.assert_array_equal(labels, eval_labels)
    np.testing.assert_array_equal(features, eval_images / np.float32(255))
    with open(os.path.join(os.path.dirname(eval_glob), "info.json")) as f:
        assert json.load(f)["counts"] == {"train": 1437, "eval": 360}


def test_the_shipped_digits_are_the_arrays_scikit_learns_load_digits_gives():
    """data/digits.csv.gz read as scikit-learn 1.9.1's `load_digits()` reads it: the same float64 images and labels
    (their sha256 taken from scikit-learn itself), and importing it pulls in neither scikit-learn nor SciPy."""
    images, labels = digits.load_digits()
    assert (images.shape, images.dtype, labels.dtype) == ((1797, 8, 8), np.float64, np.int64)
    assert hashlib.sha256(images.tobytes()).hexdigest() == (
        "20def7f70a702f0af9732fbba4375e147a7d54fe70d8c45569b8e7c1c7010c10"
    )
    assert hashlib.sha256(labels.tobytes()).hexdigest() == (
        "a3c91c262eddcf7ba8f0e37507c30284493c9b20412ffe4af30d536401f7ba21"
    )
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    code = "import sys, data.digits; data.digits.load_digits(); assert not {'sklearn', 'scipy'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_ensure_digits_second_call_is_a_cache_hit(digits_globs, monkeypatch):
    cache_dir = os.path.dirname(digits_globs[0])

    def files():
        return {name: os.stat(os.path.join(cache_dir, name)).st_mtime_ns for name in sorted(os.listdir(cache_dir))}

    before = files()
    monkeypatch.setattr(digits, "load_digits", lambda: pytest.fail("read the digits again"))
    monkeypatch.setattr(digits, "write_digits", lambda out_dir: pytest.fail(f"rebuilt the cache in {out_dir}"))
    assert data.ensure_digits(cache_dir) == digits_globs
    assert files() == before and len(before) == 7  # 4 train shards, 1 eval, info.json, README.txt: as they were
    leftovers = [name for name in os.listdir(os.path.dirname(cache_dir)) if "building" in name]
    assert leftovers == []


def test_ensure_digits_loses_a_race_gracefully(tmp_path, monkeypatch):
    cache_dir = str(tmp_path / "digits-v1")
    write_digits = digits.write_digits

    def racing_write(out_dir):
        globs = write_digits(out_dir)
        shutil.copytree(out_dir, cache_dir)  # another process moves its copy into place first
        return globs

    monkeypatch.setattr(digits, "write_digits", racing_write)
    train_glob, eval_glob = data.ensure_digits(cache_dir)
    assert train_glob == os.path.join(cache_dir, "train-*-of-00004")
    assert _count_records(eval_glob) == 360
    assert os.listdir(tmp_path) == ["digits-v1"]  # the loser's build directory is gone


def test_ensure_digits_default_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TOWERFLOW_CACHE", str(tmp_path))
    assert digits.default_cache_dir() == str(tmp_path / "digits-v1")
    (tmp_path / "digits-v1").mkdir()
    (tmp_path / "digits-v1" / "stray").write_text("x")
    monkeypatch.setattr(digits, "write_digits", lambda out_dir: None)  # the build itself is tested above
    with pytest.raises(data.DataError, match="exists but is incomplete"):
        data.ensure_digits()


def _read_info(out_dir) -> dict:
    with open(os.path.join(out_dir, "info.json")) as f:
        return json.load(f)


def test_prepare_digits(tmp_path, capsys):
    assert prepare.main(["digits", str(tmp_path)]) == 0
    assert f"--train_data={tmp_path}/train-*-of-00004" in capsys.readouterr().out
    info = _read_info(tmp_path)
    assert (info["schema"], info["shape"], info["num_classes"]) == ("image", [8, 8, 1], 10)
    assert info["counts"] == {"train": 1437, "eval": 360}
    assert (_count_records(str(tmp_path / "train-*")), _count_records(str(tmp_path / "eval-*"))) == (1437, 360)


def test_prepare_synthetic_images(tmp_path):
    args = ["synthetic", str(tmp_path), "--shape=6,5,3", "--num_classes=3", "--num_examples=30", "--num_shards=2"]
    assert prepare.main([*args, "--image_format=jpeg"]) == 0
    info = _read_info(tmp_path)
    assert info["counts"] == {"train": 30, "eval": 6}
    assert (info["schema"], info["shape"], info["image_format"]) == ("image", [6, 5, 3], "jpeg")
    assert (_count_records(str(tmp_path / "train-*-of-00002")), _count_records(str(tmp_path / "eval-*"))) == (30, 6)
    record_info = data.inspect_records(str(tmp_path / "train-*"))
    assert record_info.example_shape == (6, 5, 3)
    labels = _collect(data.make_dataset(record_info, batch_size=30, training=False))[1]
    assert set(labels.tolist()) <= {0, 1, 2}


def test_prepare_synthetic_jpeg_writes_photo_sized_jpegs_of_the_requested_shape(tmp_path):
    args = ["synthetic", str(tmp_path), "--format=jpeg", "--shape=375,500,3", "--num_classes=1000"]
    assert prepare.main([*args, "--num_examples=4", "--eval_examples=1", "--num_shards=1"]) == 0
    path = str(tmp_path / "train-00000-of-00001")
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    assert len(records) == 4
    for example in records:
        feature = example.features.feature
        encoded = feature["image/encoded"].bytes_list.value[0]
        assert encoded[:2] == b"\xff\xd8" and feature["image/format"].bytes_list.value[0] == b"JPEG"
        assert tf.io.decode_jpeg(encoded).shape == (375, 500, 3)
        assert 50_000 < len(encoded) < 200_000  # compressible like a photo (~100 KB), not pixel noise (~300 KB)


def test_prepare_synthetic_dense(tmp_path):
    assert prepare.main(["synthetic", str(tmp_path), "--shape=7", "--num_classes=4", "--num_examples=50"]) == 0
    info = _read_info(tmp_path)
    assert (info["schema"], info["shape"], info["counts"]) == ("dense", [7], {"train": 50, "eval": 10})
    record_info = data.inspect_records(str(tmp_path / "eval-*"))
    assert record_info.schema == data.DenseSchema() and record_info.example_shape == (7,)
    assert len(data.list_files(str(tmp_path / "train-*"))) == 4


@pytest.mark.parametrize(
    "bad", ["--shape=8,8", "--shape=8,8,2", "--shape=a", "--num_classes=0", "--num_shards=100", "--image_format=gif"]
)
def test_prepare_rejects_bad_arguments(tmp_path, capsys, bad):
    args = ["synthetic", str(tmp_path), "--shape=4,4,1", "--num_classes=2", "--num_examples=20", bad]
    with pytest.raises(SystemExit) as exit_info:
        prepare.main(args)
    assert exit_info.value.code == 2
    assert bad.split("=")[0] in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("shape", [(4, 4, 1), (10,)])
def test_synthetic_data_is_learnable(shape):
    (train_x, train_y), (eval_x, eval_y) = synthetic.synthetic_splits(shape, 5, 500, 200, seed=0)
    flat_train = train_x.reshape(len(train_x), -1).astype(np.float32)
    centroids = np.stack([flat_train[train_y == k].mean(axis=0) for k in range(5)])
    flat_eval = eval_x.reshape(len(eval_x), -1).astype(np.float32)
    predictions = np.argmin(((flat_eval[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (predictions == eval_y).mean() > 0.9


def test_schema_and_prepare_import_without_tensorflow():
    """`python -m data.prepare` must reject bad arguments before the slow TensorFlow import."""
    code = "import sys, data, data.prepare; from data import DataError; assert 'tensorflow' not in sys.modules"
    root = ROOT
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
