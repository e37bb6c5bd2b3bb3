"""Pipeline stages (`--pipeline_stages`) before a step runs: where a model is cut (by bytes, only where one
tensor crosses), what each schedule keeps in flight and its bubble, and the settings and models refused in one
line. The training through stages, the traced step and the memory probe are in test_pipeline.py.
"""

import itertools
import random

import keras
import pytest

from models import stages
from models.registry import ModelError
from trainer.settings import config as cfg
from trainer.step.pipeline import schedules

CNN_THREE_STAGES = ["conv1..bn2", "relu2..dense1", "dropout2..logits"]  # dense1 holds most bytes


@pytest.mark.quick
@pytest.mark.parametrize("num_stages, m", [(2, 4), (4, 8), (4, 16), (4, 2), (3, 5)])
def test_1f1b_keeps_at_most_s_minus_s_in_flight_and_gpipe_all(num_stages, m):
    one_f_one_b, gpipe = schedules.one_f_one_b(num_stages, m), schedules.gpipe(num_stages, m)
    assert [schedules.in_flight(events) for events in one_f_one_b] == [
        min(num_stages - s, m) for s in range(num_stages)
    ]
    assert [schedules.in_flight(events) for events in gpipe] == [m] * num_stages
    for per_stage in (one_f_one_b, gpipe):
        for events in per_stage:  # every micro-batch once forward, once backward, forward first
            assert sorted(events) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
            assert all(events.index(("F", j)) < events.index(("B", j)) for j in range(m))
        order = schedules.build_order(per_stage)
        assert len(order) == 2 * m * num_stages
        seen = set()
        for stage, (kind, j) in order:  # what each event needs was built before it
            needs = (stage - 1, ("F", j)) if kind == "F" else (stage + 1, ("B", j))
            assert needs in seen or (kind == "F" and stage == 0) or (kind == "B" and stage == num_stages - 1)
            seen.add((stage, (kind, j)))
        assert [[e for s, e in order if s == stage] for stage in range(num_stages)] == per_stage


@pytest.mark.quick
def test_a_schedule_that_cannot_run_is_refused_and_the_bubble_is_s_minus_1_over_m_plus_s_minus_1():
    with pytest.raises(ValueError, match="deadlocks after 1 events"):
        schedules.build_order([[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("B", 1), ("F", 0), ("B", 0)]])
    assert schedules.bubble(4, 16) == pytest.approx(3 / 19)
    assert schedules.bubble(1, 8) == 0.0


@pytest.mark.quick
def test_the_cut_minimises_the_largest_stage_by_bytes():
    rng = random.Random(3)
    for _ in range(200):
        sizes = [rng.choice([0, 1, 5, 40, 300]) for _ in range(rng.randint(2, 9))]
        parts = rng.randint(1, len(sizes))
        bounds = stages._balanced(sizes, parts)
        assert bounds[0] == 0 and bounds[-1] == len(sizes) and all(a < b for a, b in itertools.pairwise(bounds))
        best = min(
            max(sum(sizes[a:b]) for a, b in itertools.pairwise((0, *cuts, len(sizes))))
            for cuts in itertools.combinations(range(1, len(sizes)), parts - 1)
        )
        assert max(sum(sizes[a:b]) for a, b in itertools.pairwise(bounds)) == best


@pytest.mark.quick
def test_a_functional_model_is_cut_only_where_one_tensor_crosses():
    from models.cnn import cnn
    from models.resnet20 import resnet20

    names = [p.name for p in stages.pieces(cnn((8, 8, 1), 10))]
    assert names == ["conv1", "bn1", "relu1", "conv2", "bn2", "relu2", "pool", "dropout1", "flatten", "dense1",
                     "dropout2", "logits"]  # fmt: skip
    resnet = resnet20((32, 32, 3), 10)
    pieces = stages.pieces(resnet)
    # A residual block's layers are never split: each piece after the stem ends on a block's output (or the head).
    ends = [p.name for p in pieces]
    inside = [name for name in ends if "block" in name and not name.endswith(("_out", "_add"))]
    assert not inside, inside
    assert sum(len(p.layers) for p in pieces) == len(resnet.layers) - 1  # every layer but the input, once
    cut = stages.cut(resnet, 4)
    assert [s.index for s in cut] == [0, 1, 2, 3]
    owner = stages.stage_of_variables(resnet, cut)
    assert sorted(set(owner.values())) == [0, 1, 2, 3]


@pytest.mark.quick
def test_models_that_cannot_be_cut_are_refused_in_one_line():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__(name="subclassed")
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(ModelError, match="'subclassed' cannot be cut into pipeline stages: it is not a Keras"):
        stages.pieces(Subclassed())
    from models.mlp import mlp

    small = mlp((4,), 3)
    with pytest.raises(ModelError, match=r"--pipeline_stages=9 needs 9; use fewer stages"):
        stages.cut(small, 9)

    class Tied(Subclassed):  # gives its own pieces, two of which use one layer
        def pipeline_pieces(self):
            call = lambda x, training: self.dense(x)  # noqa: E731
            return [stages.Piece("first", call, (self.dense,)), stages.Piece("again", call, (self.dense,))]

    tied = Tied()
    tied(keras.ops.zeros((1, 2)))
    with pytest.raises(
        ModelError,
        match=r"variable subclassed/dense\w*/kernel is used by pipeline stages 0 and 1: a variable must belong",
    ):
        stages.cut(tied, 2)


@pytest.mark.quick
@pytest.mark.parametrize(
    "towers, message",
    [
        ({"num_towers": 4, "pipeline_stages": 3}, "--pipeline_stages (3) must divide the towers of a task (--num_gpus"),
        ({"num_towers": 2, "pipeline_stages": 2, "parameter_device": "spread"}, "--parameter_device=spread cannot"),
        ({"num_towers": 2, "pipeline_stages": 2, "jit_compile": True}, "--xla cannot be used with --pipeline_stages"),
        ({"num_towers": 2, "pipeline_stages": 2, "update_mode": "async"}, "needs --update_mode=sync"),
    ],
)
def test_settings_a_pipeline_cannot_take_are_refused(towers, message):
    from trainer.step import modes

    config = cfg.RunConfig(towers=cfg.TowerConfig(device="cpu", **towers), deterministic=False)
    with pytest.raises(cfg.ConfigError) as raised:
        modes.settle(config)
    assert message in str(raised.value)


@pytest.mark.quick
def test_a_refusal_names_what_a_backward_recomputes():
    from trainer.step.memory import device_memory

    need = device_memory.DeviceNeed("/device:CPU:0", state=3 << 20, kept=1 << 19, in_flight=4, recomputed=5 << 20)
    assert need.total == 10 << 20
    device_memory.check([need], 10)  # fits
    with pytest.raises(cfg.ConfigError) as refused:
        device_memory.check([need], 9)
    assert str(refused.value).startswith(
        "a step needs ~10.0 MiB on /device:CPU:0 (variables, slots and gradients 3.0 MiB + 4 micro-batch(es) x "
        "0.5 MiB of kept activations + 5.0 MiB recomputed in a backward), more than --device_memory_mb=9; "
    )


@pytest.mark.quick
def test_the_cut_depends_on_the_bytes_alone():
    """A rebuild (a resume, another process) cuts where the first build did: by bytes, whatever else."""
    from models.cnn import cnn

    cuts = [[s.name for s in stages.cut(cnn((8, 8, 1), 10), 3)] for _ in range(2)]
    assert cuts[0] == cuts[1] == CNN_THREE_STAGES


@pytest.mark.quick
def test_the_measured_bubble_is_each_devices_idle_share_of_its_pipelines_span():
    from trainer.step.pipeline.clock import bubble_of

    # 2 stages, 2 micro-batches, one pipeline, 1f1b: stage 0 runs F0 [0,1], F1 [1,2], B0 [4,6], B1 [6,8];
    # stage 1 runs F0 [1,2], B0 [2,4], F1 [4,5], B1 [5,6]. Span 0..8; busy 6 and 5.
    names = ["0:F0", "1:F0", "1:B0", "0:F1", "1:F1", "0:B0", "1:B1", "0:B1"]
    events = [(0, 1), (1, 2), (2, 4), (1, 2), (4, 5), (4, 6), (5, 6), (6, 8)]
    busy, measured = bubble_of(names, events, num_stages=2, num_pipelines=1)
    assert busy == [6, 5]
    assert measured == pytest.approx(((1 - 6 / 8) + (1 - 5 / 8)) / 2)
    assert bubble_of(names, None, 2, 1) == (None, None)
    # A clock that ran late (stage 0's F1 "ends" at 7, after its B0 started at 4): cut there, 3 s, not 6.
    late = [(0, 1), (1, 2), (2, 4), (1, 7), (4, 5), (4, 6), (5, 6), (6, 8)]
    assert bubble_of(names, late, 2, 1)[0] == [8, 5]


@pytest.mark.quick
def test_the_schedule_probe_reads_micro_batches_in_flight_from_start_times():
    from benchmarks.probes import pipeline_schedule

    events = [("0:F0", (0.0, 1.0)), ("0:F1", (1.0, 2.0)), ("0:B0", (2.5, 3.0)), ("1:F0", (1.0, 2.0))]
    events += [("0:F2", (3.0, 4.0)), ("0:B1", (4.0, 5.0)), ("0:B2", (5.0, 6.0))]
    assert pipeline_schedule.in_flight_from_times(events, 0) == 2
    assert pipeline_schedule.in_flight_from_times(events, 1) == 1
    drawn = pipeline_schedule.svg({"1f1b": {"events": events}}, num_stages=2)
    assert drawn.count("<rect") == len(events) and "stage 1" in drawn
