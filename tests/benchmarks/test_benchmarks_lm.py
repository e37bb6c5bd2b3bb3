"""The language model's benchmarks: its figures against Keras `fit` (a task setting, benchmarks/harness/lm.py)
and the padding probe (benchmarks/probes/lm_padding.py). What the sides feed the model is checked value by
value; how fast they are, this noisy machine cannot say (benchmarks/results/lm.md)."""

import dataclasses

import numpy as np
import pytest

from benchmarks import figures
from benchmarks.harness import records as records_lib
from benchmarks.harness.plan import SETTINGS, SIZES, Setting, Side

# The lm setting's records at batch 8 (64 examples in memory); `tiny_model` shrinks the model of both sides.
SMALL = Setting("lm-small", "transformer_lm", (65,), 0, 8, "pydoc", 64, task="lm")
TINY = {"layers": 1, "heads": 2, "width": 32}


@pytest.fixture(scope="module")
def small_records():
    return records_lib.ensure_records(SMALL)


@pytest.fixture
def tiny_model(monkeypatch):
    """Both sides' task (lm.task_config) at one block of width 32: the same code, a fraction of the tracing."""
    from benchmarks.harness import lm
    from trainer.settings.config import TaskConfig

    tiny = lambda setting: TaskConfig(name=setting.task, options={"context": 64, **TINY})  # noqa: E731
    monkeypatch.setattr(lm, "task_config", tiny)


@pytest.mark.quick
def test_the_lm_setting_has_exactly_its_three_keras_fit_figures():
    setting = SETTINGS["lm-pydoc"]
    found = figures.figures(setting, SIZES["quick"])
    assert tuple(f.name for f in found) == figures.TASK_NAMES
    assert [f.target for f in found] == [0.95, 1.0, 1.0]
    assert [(f.a.kind, f.a.towers) for f in found] == [("towerflow", 1), ("towerflow", 2), ("towerflow", 4)]
    assert [(f.b.kind, f.b.towers, f.b.steps_per_execution) for f in found] == [("keras_fit", n, 32) for n in (1, 2, 4)]
    assert figures.select(found, ["lm"], SIZES["quick"]) == found
    assert figures.select(found, ["lm_tower2_vs_keras_fit_mirrored"], SIZES["quick"]) == found[1:2]
    # the image settings keep their figures
    assert tuple(f.name for f in figures.figures(SETTINGS["cnn-digits"], SIZES["quick"])) == figures.NAMES


def test_both_sides_read_the_same_tokens(small_records):
    from benchmarks.harness import lm

    tokens, lengths = lm.memory_batches(SMALL, small_records["train"])
    assert tokens.shape == (8, 8, 65) and lengths.shape == (8, 8)  # 64 examples // 8
    assert tokens.dtype == np.int32 and lengths.min() >= 2 and lengths.max() == 65
    micro = [
        (b["tokens"].numpy(), b["tokens_length"].numpy()) for b in lm.towerflow_dataset(SMALL, small_records, 4).take(4)
    ]
    np.testing.assert_array_equal(np.concatenate([m[0] for m in micro[:2]]), tokens[0])
    np.testing.assert_array_equal(np.concatenate([m[1] for m in micro[2:]]), lengths[1])
    (ids, model_lengths), targets, mask = next(iter(lm.keras_dataset(SMALL, small_records)))
    np.testing.assert_array_equal(ids.numpy(), tokens[0, :, :-1])
    np.testing.assert_array_equal(targets.numpy(), tokens[0, :, 1:])
    np.testing.assert_array_equal(model_lengths.numpy(), lengths[0] - 1)
    np.testing.assert_array_equal(mask.numpy(), np.ones([8, 64], np.float32))  # full windows: no padding


@pytest.mark.quick
def test_keras_weighs_only_the_real_targets_of_padded_records():
    from benchmarks.harness import lm

    tokens = np.array([[5, 6, 7, 8, 9], [1, 2, 0, 0, 0], [3, 4, 5, 0, 0]], np.int32)
    (ids, lengths), targets, mask = lm.keras_batches(tokens, np.array([5, 2, 3], np.int32))
    np.testing.assert_array_equal(ids, [[5, 6, 7, 8], [1, 2, 0, 0], [3, 4, 5, 0]])
    np.testing.assert_array_equal(lengths, [4, 1, 2])
    np.testing.assert_array_equal(targets, [[6, 7, 8, 9], [2, 0, 0, 0], [4, 5, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]])
    assert mask.dtype == np.float32


def test_towerflow_and_keras_fit_start_from_the_same_transformer_and_train_whole_batches(
    small_records, tmp_path, tiny_model
):
    from benchmarks.harness import lm
    from models.transformer import parameter_count

    towerflow = lm.make_side(Side("towerflow"), SMALL, small_records, str(tmp_path))
    keras_fit = lm.make_side(Side("keras_fit", steps_per_execution=2), SMALL, small_records, "")
    try:
        ours, theirs = towerflow.trainer.model.get_weights(), keras_fit.model.get_weights()
        vocab = ours[0].shape[0]
        assert sum(w.size for w in ours) == parameter_count(vocab, TINY["layers"], TINY["width"], 64, "learned")
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(a, b)
        assert towerflow.window(2)[1] == 2 * 8
        assert keras_fit.window(3)[1] == 4 * 8  # whole executions of 2 steps
        assert keras_fit.model.loss.get_config()["from_logits"] is True
    finally:
        towerflow.close()
        keras_fit.close()
    with pytest.raises(ValueError, match="has no 'plain' side"):
        lm.make_side(Side("plain"), SMALL, small_records, "")


def test_padding_ways_batch_the_same_examples_with_less_padding(tmp_path):
    from benchmarks.probes import lm_padding
    from trainer.settings import config as cfg

    glob = lm_padding.write_records(str(tmp_path))
    import tasks

    task_config = cfg.TaskConfig(name="lm", options={"context": lm_padding.CONTEXT})
    task = tasks.make_task(cfg.RunConfig(data=cfg.DataConfig(train_data=glob), task=task_config))
    # Batches of 2: at context 64, 70% of the records are full windows, so most larger batches hold one.
    makers = lm_padding.datasets(task, glob, batch_size=2, pool=4)
    batches = {way: [(b["tokens"].shape[1], b["tokens_length"].numpy()) for b in make().take(48)]
               for way, make in makers.items()}  # fmt: skip
    buckets = task.features()["tokens"].buckets
    assert {width for width, _ in batches["max_length"]} == {65}
    for (width, lengths), (_, same) in zip(batches["buckets"], batches["max_length"], strict=True):
        np.testing.assert_array_equal(lengths, same)  # the same examples, in the same order
        assert width == min(b for b in buckets if b >= lengths.max())
    for pool in range(12):  # each pool of 4 batches holds the same examples, sorted by length
        cut = slice(4 * pool, 4 * pool + 4)
        grouped = np.concatenate([lengths for _, lengths in batches["grouped"][cut]])
        plain = np.concatenate([lengths for _, lengths in batches["buckets"][cut]])
        np.testing.assert_array_equal(np.sort(grouped), np.sort(plain))
    computed = {way: sum(width * len(lengths) for width, lengths in found) for way, found in batches.items()}
    assert computed["grouped"] < computed["buckets"] < computed["max_length"] == 48 * 2 * 65


@pytest.mark.quick
def test_the_padding_report_gives_each_way_its_median_and_the_ratios():
    from benchmarks.probes import lm_padding

    @dataclasses.dataclass
    class Counted:
        real: int
        computed: int

    ways = {"buckets": Counted(85, 100), "max_length": Counted(85, 100), "grouped": Counted(90, 100)}
    rates = {"buckets": [10.0, 30.0, 20.0], "max_length": [10.0, 10.0, 40.0], "grouped": [25.0, 25.0, 0.0]}
    lines = lm_padding.report(ways, rates)
    assert lines[1].split() == ["buckets", "20", "0.850"]
    assert lines[3].split() == ["grouped", "25", "0.900"]
    assert lines[4:] == ["buckets_vs_max_length: 2.000", "grouped_vs_max_length: 2.500", "grouped_vs_buckets: 1.250"]
