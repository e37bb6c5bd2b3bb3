"""benchmarks/probes/tensor_parallel.py at a tiny size (byte tokens, 1 or 2 blocks of 2 heads, width 32, context
8, 2 sequences, N = 2) on the session's 4 logical CPU devices, in process: each device's state is its share of
the model's by formula and the shares add up to the model's; what a device needs falls with T; the bytes a
step moves, per layer, are the probe's formula of what the step runs, exactly; at N = T, the design's."""

import pytest

from benchmarks.probes import tensor_parallel as probe

SIZE = probe.Size(layers=1, heads=2, width=32, context=8, micro_batch=2)
N = 2


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_probe")
    train_data = probe.byte_records(str(root), SIZE.context)
    found = {}
    for parallel, shards, layers in ((1, 1, 1), (1, N, 1), (2, N, 1), (2, N, 2)):
        size = probe.Size(layers, SIZE.heads, SIZE.width, SIZE.context, SIZE.micro_batch)
        found[parallel, shards, layers] = probe.measure(size, parallel, shards, train_data, str(root / str(len(found))))
    return found


def _total(row) -> int:
    return sum(row["sent"].values())


def test_state_per_device_is_the_formulas_share_and_adds_up_to_the_model(rows):
    whole = rows[1, 1, 1]["state"][0]
    assert rows[1, N, 1]["state"] == probe.state_formula(SIZE, 1, N) == [whole]  # N shards: the same weights
    for parallel in (2,):
        row = rows[parallel, N, 1]
        assert row["devices"] == [f"CPU:{i}" for i in range(parallel)]
        assert row["state"] == probe.state_formula(SIZE, parallel, N)
        assert sum(row["state"]) == whole


def test_what_the_busiest_device_needs_falls_with_t(rows):
    busiest = [max(s + k for s, k in zip(rows[t, N, 1]["state"], rows[t, N, 1]["kept"], strict=True)) for t in (1, 2)]
    assert busiest[0] > busiest[1]


def test_the_counted_bytes_are_the_probes_formula(rows):
    assert _total(rows[1, 1, 1]) == _total(rows[1, N, 1]) == 0  # one device: nothing crosses
    split_weights = SIZE.layers * (12 * SIZE.width**2 + 7 * SIZE.width) + 2 * probe.VOCAB * SIZE.width
    kinds = rows[2, N, 1]["kinds"]
    assert kinds.get("weights", 0) == 0 < split_weights  # every shard's weights are read where they live
    assert kinds.get("embedding gradient", 0) == 0  # made dense on its shard's device
    one_layer = probe.moved_activations(rows[2, N, 2]) - probe.moved_activations(rows[2, N, 1])
    assert one_layer == probe.layer_formula(SIZE, 2, N)["counted"]


def test_at_n_equal_to_t_a_layer_moves_what_megatron_moves(rows):
    """N = T = 2: each shard's input copy, output gradient and trees are the design's 4(T-1) A a block, the bytes
    of Megatron's all-reduces. (At N > T each off-device shard gets its own copy of a block's input: N - N/T,
    not T - 1; `layer_formula` counts it.)"""
    one_layer = probe.moved_activations(rows[2, N, 2]) - probe.moved_activations(rows[2, N, 1])
    assert one_layer == probe.layer_formula(SIZE, 2, N)["scheme"] == 8 * SIZE.activation
