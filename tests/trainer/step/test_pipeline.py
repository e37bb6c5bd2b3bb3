"""Pipeline stages (`--pipeline_stages`): the promise that a model trained through S stages has the weights of
data-parallel training at fixed K, read as weights_sha256; the traced step's order, remat, clocks and memory.
Where a model is cut and what the schedules keep in flight: test_pipeline_cut.py.

The language model's stages (its blocks, 4x1 / 2x2 / 1x4, on two tasks, killed and resumed with another S) are
in tests/tasks/test_lm_training.py, beside its one-tower reference; a user task over a Keras Hub GPT-2 backbone,
cut inside the backbone (models/functional_cut.py), is here.
"""

import numpy as np
import pytest
import tensorflow as tf

from trainer.settings import config as cfg
from trainer.step.pipeline import schedules

K = 8


def _config(model_dir, num_towers, num_stages, schedule="1f1b", remat=False) -> cfg.RunConfig:
    """The cnn (BatchNorm, two Dropouts) on the digits, K = 8, 6 steps, on logical CPU devices."""
    towers = cfg.TowerConfig(
        num_towers=num_towers,
        device="cpu",
        parameter_device="cpu",
        global_batch_size=64,
        micro_batches=K,
        pipeline_stages=num_stages,
        pipeline_schedule=schedule,
        pipeline_remat=remat,
    )
    loop = cfg.LoopConfig(
        model_dir=str(model_dir),
        train_steps=6,
        log_every_steps=3,
        eval_every_steps=0,
        checkpoint_every_steps=0,
        histogram_every_steps=0,
        export=False,
    )
    return cfg.RunConfig(towers=towers, loop=loop, model=cfg.ModelConfig(name="cnn"), deterministic=True)


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory):
    """The weights every pipeline must reproduce: 4 towers without stages."""
    from trainer.loop.run import train

    return train(_config(tmp_path_factory.mktemp("pipeline") / "reference", 4, 1))


@pytest.mark.parametrize(
    "num_towers, num_stages, schedule, remat",
    [(4, 2, "1f1b", False), (4, 4, "gpipe", False), (2, 2, "gpipe", False)]
    + [(4, 2, "1f1b", True), (4, 4, "gpipe", True)],
)
def test_a_convolutional_model_with_batchnorm_trains_the_data_parallel_weights(
    tmp_path, data_parallel, num_towers, num_stages, schedule, remat
):
    """Also with --pipeline_remat: the forward run again in the backward draws the same Dropout masks and
    BatchNorm statistics (2x2 1f1b recomputes stage 0 only, 1x4 gpipe every stage)."""
    from trainer.loop.run import train

    result = train(_config(tmp_path / "piped", num_towers, num_stages, schedule, remat))
    assert result["weights_sha256"] == data_parallel["weights_sha256"]
    assert result["train_loss"] == data_parallel["train_loss"]
    # eval through the stages: its K parts are those of the 4 towers without stages, each the same outputs
    evaluated = ("eval_loss", "eval_accuracy")
    assert [result[k] for k in evaluated] == [data_parallel[k] for k in evaluated]
    pipeline = result["pipeline"]
    assert (pipeline["stages"], pipeline["pipelines"], pipeline["schedule"]) == (
        num_stages, num_towers // num_stages, schedule
    )  # fmt: skip
    assert pipeline["stage_devices"] == [f"/device:CPU:{s}" for s in range(num_stages)]
    m = K // pipeline["pipelines"]
    assert pipeline["bubble_expected"] == pytest.approx((num_stages - 1) / (m + num_stages - 1))
    assert 0.0 <= pipeline["bubble_measured"] < 1.0
    assert pipeline["remat"] is remat
    recomputing = [s for s in range(num_stages) if remat and (schedule == "gpipe" or s < num_stages - 1)]
    assert pipeline["recomputing_stages"] == recomputing
    assert result["parameter_devices"] == [f"/job:localhost/replica:0/task:0/device:CPU:{s}" for s in range(num_stages)]


def test_a_keras_hub_backbone_trains_the_data_parallel_weights_cut_between_its_layers(tmp_path, make_config):
    """benchmarks/harness/hub_tasks.py `HubGPT2` (a GPT2Backbone, dropout 0.1, nested in the task's model) at S = 2, cut
    after the embeddings' dropout: the block, with the padding mask crossing beside the activation, on the second
    device. The weights of 2 towers without stages. Two runs of 2 steps: about 30 s."""
    pytest.importorskip("keras_hub")
    from benchmarks.harness import hub_tasks
    from trainer.loop.run import train

    train_data, eval_data = hub_tasks.write_records(str(tmp_path))
    runs = {}
    for num_stages, cuts in ((1, ()), (2, ("embeddings_dropout",))):
        config = make_config(
            model_dir=tmp_path / f"s{num_stages}",
            towers={"global_batch_size": 4, "micro_batches": 2, "pipeline_stages": num_stages, "pipeline_cuts": cuts},
            loop={"train_steps": 2, "log_every_steps": 1},
            data={"train_data": train_data, "eval_data": eval_data},
            task={"name": "benchmarks.harness.hub_tasks:HubGPT2"},
        )
        runs[num_stages] = train(config)
    assert runs[2]["pipeline"]["stage_pieces"] == ["token_embedding..embeddings_dropout", "transformer_layer_0..head"]
    assert runs[2]["weights_sha256"] == runs[1]["weights_sha256"]
    assert (runs[2]["train_loss"], runs[2]["eval_loss"]) == (runs[1]["train_loss"], runs[1]["eval_loss"])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_traced_step_runs_each_stage_in_the_schedules_order(tmp_path, schedule):
    """Each event's ops wait on the previous event of their device (a control input from its `done`): the
    order per device read back from the graph is the schedule's, so 1f1b keeps at most S - s micro-batches'
    activations on stage s and gpipe all of them."""
    from trainer.loop.build import build

    num_stages = 4
    trainer = build(_config(tmp_path / "graph", 4, num_stages, schedule))
    graph = trainer.updater.step_graph()
    events = {}  # name scope -> the done op of the event before it on its device
    for op in graph.get_operations():
        scope = op.name.rsplit("/", 1)[0]
        for control in op.control_inputs:
            if control.name.endswith("/done") and control.name.rsplit("/", 1)[0] != scope:
                events.setdefault(scope, set()).add(control.name.rsplit("/", 1)[0])
    for stage in range(num_stages):
        mine = [op.name.rsplit("/", 1)[0] for op in graph.get_operations() if op.name.endswith("/done")]
        mine = [name for name in mine if name.startswith(f"pipeline0_stage{stage}_")]
        before = {name: events.get(name, set()) for name in mine}
        assert sum(1 for name in mine if not before[name]) == 1  # one first event
        chain = [next(name for name in mine if not before[name])]
        while len(chain) < len(mine):
            chain.append(next(name for name in mine if before[name] == {chain[-1]}))
        read = [(name.rsplit("_", 1)[1][0], int(name.rsplit("_", 1)[1][1:])) for name in chain]
        assert read == schedules.SCHEDULES[schedule](num_stages, K)[stage]
        expected = min(num_stages - stage, K) if schedule == "1f1b" else K
        assert schedules.in_flight(read) == expected
    trainer.updater.close()


def test_with_remat_a_stage_recomputes_its_forward_inside_its_backward_event(tmp_path):
    """1f1b at S = 4: stages 0-2 hold more than one micro-batch, so their forward events run without a tape and
    their backward events run the forward again (every Conv2D, MatMul and batch norm of the forward, under
    "<event>/recompute") and differentiate that; the recomputed ops wait (data or control, transitively) on the
    device's previous event. The last stage (one micro-batch in flight) keeps its tape."""
    from trainer.loop.build import build

    num_stages = 4
    trainer = build(_config(tmp_path / "remat", 4, num_stages, "1f1b", remat=True))
    graph = trainer.updater.step_graph()
    trainer.updater.close()
    ops = graph.get_operations()
    controlled = {}
    for op in ops:
        for control in op.control_inputs:
            controlled.setdefault(control, []).append(op)
    compute = ("Conv2D", "MatMul", "FusedBatchNormV3")
    for stage, events in enumerate(schedules.one_f_one_b(num_stages, K)):
        for index, (kind, j) in enumerate(events):
            if kind == "F":
                continue
            forward, backward = f"pipeline0_stage{stage}_F{j}/", f"pipeline0_stage{stage}_B{j}/"
            taped = [op for op in ops if op.name.startswith(f"gradient_tape/{forward}")]
            recomputed = [op for op in ops if op.name.startswith(f"{backward}recompute/")]
            ran = sorted(op.type for op in ops if op.name.startswith(forward) and op.type in compute)
            assert ran, forward
            if stage == num_stages - 1:
                assert taped and not recomputed
                continue
            assert not taped
            assert sorted(op.type for op in recomputed if op.type in compute) == ran
            if j == 0:  # the first backward (the walk is slow in Python): after the device's previous event
                kind_before, j_before = events[index - 1]
                done = graph.get_operation_by_name(f"pipeline0_stage{stage}_{kind_before}{j_before}/done")
                assert set(recomputed) <= _after(done, controlled), stage


def _after(op, controlled: dict) -> set:
    """Every op that runs after `op`: its data and control consumers (`controlled`: op -> ops it is a control
    input of), transitively."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for consumer in [c for out in current.outputs for c in out.consumers()] + controlled.get(current, []):
            if consumer not in seen:
                seen.add(consumer)
                todo.append(consumer)
    return seen


@pytest.mark.parametrize("num_stages", [1, 2])
def test_the_clocks_of_a_timed_step_do_not_order_the_towers(tmp_path, num_stages):
    """A timed step (the last of each logging window) reads host clocks around every tower's (stage's) work. A
    stateful callback would be chained to the others in the order the step was traced, making each tower wait
    for the previous tower's end: the clocks must carry no control input from one another. In the in-graph
    loop, which times its last step, each clock sits in a `tf.cond` on that switch: a StatelessIf, for the same
    reason, with no control input from another clock's; in the one-step graph (a step that returns gradients),
    the clocks themselves."""
    from trainer.loop.build import build

    trainer = build(_config(tmp_path / "clocks", 2, num_stages))
    updater = trainer.updater
    iterators = [it.iterator for it in updater.iterators]
    # Towers: a start per tower and an end after each micro-batch (the last one is read); stages: two per event.
    expected = 2 + K if num_stages == 1 else 2 * (2 * K * num_stages)
    graph = updater._step_fn.get_concrete_function(iterators, True, False).graph
    clocks = [op for op in graph.get_operations() if op.type in ("PyFunc", "PyFuncStateless", "EagerPyFunc")]
    assert len(clocks) == expected
    assert not [op.name for op in clocks if any(c in clocks for c in op.control_inputs)]
    loop = updater.calls.loop_fn.get_concrete_function(
        iterators, tf.constant(1), updater.graph.zero_totals(), tf.constant(True)
    )
    switches = _clock_switches(loop.graph.as_graph_def())
    assert len(switches) == expected and {node.op for node in switches} == {"StatelessIf"}
    names = {node.name for node in switches}
    assert not [node.name for node in switches if any(i.lstrip("^") in names for i in node.input if i[0] == "^")]
    trainer.updater.close()


def _clock_switches(graph_def) -> list:
    """The conditionals of a traced graph's functions whose true branch reads a host clock (`mb.now`)."""
    library = graph_def.library.function
    clocked = {f.signature.name for f in library if any(n.op.startswith("PyFunc") for n in f.node_def)}
    nodes = [n for f in library for n in f.node_def] + list(graph_def.node)
    return [n for n in nodes if n.op.endswith("If") and n.attr["then_branch"].func.name in clocked]


def test_the_memory_probe_counts_every_placed_byte_and_the_kept_activations():
    """State per stage device sums to the weights, a gradient each and Adam's two slots each; each stage keeps
    activations for its backward pass, the same whatever the schedule (the schedule decides how many micro-batches,
    not what one keeps). With remat (gpipe: both stages recompute) a stage keeps its inputs per micro-batch (4
    images of 8 x 8 x 1; bn2's output, 4 x 8 x 8 x 64, float32) and one micro-batch's activations, exactly what
    the stage kept without remat."""
    from benchmarks.probes import pipeline_memory

    one, other = (pipeline_memory.measure("classify", 2, 4, schedule) for schedule in ("1f1b", "gpipe"))
    remat = pipeline_memory.measure("classify", 2, 4, "gpipe", remat=True)
    assert remat["saved"] == [4 * 8 * 8 * 1 * 4, 4 * 8 * 8 * 64 * 4]
    assert remat["recomputed"] == other["saved"] and one["recomputed"] == other["recomputed"] == [0, 0]
    assert remat["total"] == [
        st + 4 * kept + re for st, kept, re in zip(remat["state"], remat["saved"], other["saved"], strict=True)
    ]
    assert all(r < o for r, o in zip(remat["total"], other["total"], strict=True))
    from models.cnn import cnn

    model = cnn((8, 8, 1), 10)
    size = lambda v: int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize  # noqa: E731
    trainable = sum(size(v) for v in model.trainable_variables)
    non_trainable = sum(size(v) for v in model.non_trainable_variables)
    # Weights, gradients, Adam's m and v; BatchNorm statistics and seeds; Adam's step counter (an int64).
    assert sum(one["state"]) == 4 * trainable + non_trainable + 8
    assert one["saved"] == other["saved"] and all(s > 0 for s in one["saved"])
    assert (one["in_flight"], other["in_flight"]) == ([2, 1], [4, 4])
