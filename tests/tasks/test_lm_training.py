"""The language model through the engine, on padded records of real text (paragraphs of different lengths).

What the tasks issue promises: the same weights for 1, 2 and 4 towers and 2 tasks x 2 towers at fixed K, with
micro-batches holding different numbers of real tokens; the loss the engine reports is the mean over the global
batch's real tokens (a numpy reference); a run killed and resumed (with length grouping, whose positions have
three numbers) ends with the weights of one that was not; the export answers as eval did, in a fresh process.
"""

import dataclasses
import glob
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from data import text as text_data
from tests.support.cluster import Job, metrics, tf_config_envs, train_tags
from tests.support.paths import ROOT
from tests.support.served import RESTORED_EVAL
from trainer.settings import config as cfg

K = 4
STEPS = 6
SIZES = ("--lm_layers=2", "--lm_heads=2", "--lm_width=16", "--lm_context=32")
OPTIMIZER = ("--optimizer=adamw", "--learning_rate=0.003", "--global_batch_size=8", f"--micro_batches={K}")


@pytest.fixture(scope="module")
def paragraphs(tmp_path_factory):
    """Records of the built-in corpus's first 40,000 characters, one per paragraph (split into windows of 33
    tokens when longer): lengths from 2 to 33."""
    root = tmp_path_factory.mktemp("paragraphs")
    source = root / "text.txt"
    text = text_data.default_corpus()[0][:40_000]
    source.write_text(text, encoding="utf-8")
    out = root / "records"
    command = [sys.executable, "-m", "data.prepare", "text", str(source), str(out), "--tokens=char", "--context=32"]
    subprocess.run([*command, "--documents=paragraphs"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return {"train_data": str(out / "train-*"), "eval_data": str(out / "eval-*"), "sha256": sha256}


def _flags(paragraphs, *more) -> tuple:
    data_flags = (f"--train_data={paragraphs['train_data']}", f"--eval_data={paragraphs['eval_data']}")
    return ("--task=lm", *data_flags, *SIZES, *OPTIMIZER, f"--train_steps={STEPS}", *more)


def _config(make_config, paragraphs, tmp_path, name: str, num_towers: int, **data) -> cfg.RunConfig:
    config = make_config(
        model_dir=tmp_path / name,
        towers={"num_towers": num_towers, "micro_batches": K, "global_batch_size": 8},
        loop={"train_steps": STEPS, "log_every_steps": 1},
        data={"train_data": paragraphs["train_data"], "eval_data": paragraphs["eval_data"], **data},
        optimizer={"name": "adamw", "learning_rate": 0.003},
    )
    task = cfg.TaskConfig(name="lm", options={"layers": 2, "heads": 2, "width": 16, "context": 32})
    return dataclasses.replace(config, task=task)


@pytest.fixture(scope="module")
def reference(paragraphs, tmp_path_factory):
    """One process, one tower, K = 4: the weights every layout must reproduce (and the export to serve)."""
    model_dir = tmp_path_factory.mktemp("reference") / "run"
    job = Job(model_dir, [{}], 1, *_flags(paragraphs, "--export", "--eval_every_steps=0"))
    assert job.wait() == [0], job.output(0)[-3000:]
    return {**metrics(model_dir), "model_dir": str(model_dir)}


# (2, "cpu") ran what (4, "cpu") runs (the towers' runner, the variables on the CPU) at the count (2, "spread")
# runs; the counts 1 (the reference), 2 (spread, bf16), 4 and 2 tasks x 2 (test_grouped_by_length_...) stay.
@pytest.mark.parametrize("num_towers, placement", [(4, "cpu"), (2, "spread")])
def test_the_weights_are_those_of_one_tower_for_any_number_of_towers(
    make_config, paragraphs, reference, tmp_path, num_towers, placement
):
    """Spread: each variable and its slots on one tower's device (the embedding on one, ...): the same bits."""
    from trainer.loop.run import train

    config = _config(make_config, paragraphs, tmp_path, f"n{num_towers}", num_towers)
    config = dataclasses.replace(config, towers=dataclasses.replace(config.towers, parameter_device=placement))
    result = train(config)
    assert result["weights_sha256"] == reference["weights_sha256"]
    assert (result["global_step"], result["num_towers"], result["task"]) == (STEPS, num_towers, "lm")
    assert result["train_loss"] == reference["train_loss"]  # the last step's loss: the same sums in the same tree
    # Eval cuts each batch into the K parts, not into the towers: every eval figure is the same bits.
    evaluated = {k: v for k, v in result.items() if k.startswith("eval_")}
    assert sorted(evaluated) == ["eval_accuracy", "eval_bits_per_byte", "eval_examples", "eval_loss", "eval_perplexity"]
    assert evaluated == {k: reference[k] for k in evaluated}


# 1f1b on 4 stages without remat: its schedule is the remat case's, its stages' passes gpipe's and those of the
# 2 stages of test_killed_on_two_tasks_of_two_stages_... (1f1b, the default).
@pytest.mark.parametrize(
    "num_towers, num_stages, schedule, cuts, remat, pieces",
    [
        (4, 2, "gpipe", ("block_1",), False, ["embedding..block_1", "head"]),  # by bytes: after block_0
        (4, 4, "1f1b", (), True, ["embedding", "block_0", "block_1", "head"]),
    ],
)
def test_through_pipeline_stages_the_weights_are_those_of_one_tower(
    make_config, paragraphs, reference, tmp_path, num_towers, num_stages, schedule, cuts, remat, pieces
):
    """The embedding, the two blocks and the head on 4 stages (1 pipeline) with --pipeline_remat (stages 0-2
    recompute their forward in their backward), or 2 pipelines of 2 stages cut where --pipeline_cuts says: the
    same bits as one tower without stages (docs/pipelines.md)."""
    from trainer.loop.run import train

    config = _config(make_config, paragraphs, tmp_path, f"s{num_stages}", num_towers)
    towers = dataclasses.replace(
        config.towers,
        pipeline_stages=num_stages,
        pipeline_schedule=schedule,
        pipeline_cuts=cuts,
        pipeline_remat=remat,
    )
    result = train(dataclasses.replace(config, towers=towers))
    assert result["pipeline"]["recomputing_stages"] == ([0, 1, 2] if remat else [])
    assert result["weights_sha256"] == reference["weights_sha256"]
    assert result["train_loss"] == reference["train_loss"]
    assert result["pipeline"]["stage_pieces"] == pieces


def test_in_bf16_the_weights_are_those_of_one_tower_for_two_towers(make_config, paragraphs, reference, tmp_path):
    """--mixed_precision=bf16 (the blocks compute in bfloat16, the variables and the sums stay float32): 1 and 2
    towers at fixed K give the same bits, and not the float32 run's."""
    import keras

    from trainer.loop.run import train

    results = []
    try:
        for num_towers in (1, 2):
            config = _config(make_config, paragraphs, tmp_path, f"bf16_{num_towers}", num_towers)
            towers = dataclasses.replace(config.towers, mixed_precision="bf16")
            results.append(train(dataclasses.replace(config, towers=towers)))
    finally:
        keras.mixed_precision.set_global_policy("float32")  # the run set the process's policy
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    assert results[0]["train_loss"] == results[1]["train_loss"]
    assert results[0]["weights_sha256"] != reference["weights_sha256"]  # bfloat16 compute changed the bits


def test_killed_on_two_tasks_of_two_stages_a_run_resumes_on_four_stages_bitwise(paragraphs, reference, tmp_path):
    """Stages within a machine, pipelines across machines (2 tasks x 1 pipeline of 2 stages), SIGKILLed after its
    step-3 checkpoint, resumed by one process as one pipeline of 4 stages: the one-tower weights. A checkpoint
    does not depend on S."""
    flags = _flags(paragraphs, "--checkpoint_every_steps=3", "--log_every_steps=1")
    job = Job(tmp_path / "run", tf_config_envs(2), 2, *flags, "--pipeline_stages=2")
    job.wait_for_step(4)
    job.kill()
    assert glob.glob(str(tmp_path / "run" / "checkpoints" / "ckpt-3.index")), "no checkpoint before the kill"
    rerun = Job(tmp_path / "run", [{}], 4, *flags, "--pipeline_stages=4", "--pipeline_schedule=gpipe")
    assert rerun.wait() == [0], rerun.output(0)[-3000:]
    assert "at step 3" in rerun.output(0)
    result = metrics(tmp_path / "run")
    assert result["weights_sha256"] == reference["weights_sha256"]
    assert (result["pipeline"]["stages"], result["pipeline"]["schedule"]) == (4, "gpipe")
    # TensorBoard names each device's step time with its stage: both tasks' devices, then the 4 of one task
    want = {f"tower_step_sec/task_{t}_cpu_{s}_stage_{s}" for t in range(2) for s in range(2)}
    want |= {f"tower_step_sec/tower_{s}_stage_{s}" for s in range(4)}
    assert want <= train_tags(tmp_path / "run")


def test_the_loss_is_the_mean_over_the_real_tokens_of_the_global_batch(make_config, paragraphs, tmp_path):
    """The first step's loss, from the initial weights, against numpy over the same four micro-batches; they hold
    different numbers of real tokens, so a mean of the micro-batches' means would differ. On one tower: at 2 and
    4 towers, and through stages, the loss is that of one tower bit for bit (the tests above)."""
    from trainer.loop.build import build

    trainer = build(_config(make_config, paragraphs, tmp_path, "loss", 1))
    try:
        batches = [next(iter(stream._make_dataset((0, 0))))[0] for stream in trainer.iterators]
        real = [int(np.sum(b["tokens_length"].numpy() - 1)) for b in batches]
        assert len(set(real)) > 1, real  # micro-batches of different real-token counts
        losses = [_token_losses(trainer.model, b) for b in batches]
        expected = np.sum(np.concatenate(losses)) / sum(real)
        assert np.mean([np.mean(x) for x in losses]) != pytest.approx(expected, rel=1e-3)  # the wrong mean differs
        result = trainer.updater.train_steps(1)
        assert result.loss == pytest.approx(expected, rel=2e-6)
    finally:
        trainer.updater.close()


def _token_losses(model, batch) -> np.ndarray:
    """float64 cross-entropy of every real target token of `batch` (padding left out), from numpy."""
    tokens, lengths = batch["tokens"].numpy(), batch["tokens_length"].numpy()
    logits = model((tokens[:, :-1], lengths - 1), training=False).numpy().astype(np.float64)
    log_p = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True))
    log_p -= logits.max(-1, keepdims=True)
    out = []
    for row in range(len(tokens)):
        for t in range(lengths[row] - 1):
            out.append(-log_p[row, t, tokens[row, t + 1]])
    return np.array(out)


def test_grouped_by_length_a_killed_run_resumes_on_another_layout_bitwise(make_config, paragraphs, reference, tmp_path):
    """--group_by_length=2: each stream sorts pools of two micro-batches by length (its position is then
    (epoch, record, batches done in the pool)). Killed on 2 tasks x 2 towers after its step-3 checkpoint,
    resumed on one process of 4 towers: the weights of an uninterrupted one-tower run. Its first 3 steps are
    those of 2 tasks x 2 towers: the language model's bits on two tasks (an uninterrupted two-task run, 96 s
    under -n 3, ran no other code of the task; tests/trainer/system/test_multinode.py runs tasks to the end)."""
    from trainer.loop.run import train

    whole = train(_config(make_config, paragraphs, tmp_path, "whole", 1, group_by_length=2))
    flags = _flags(paragraphs, "--group_by_length=2", "--checkpoint_every_steps=3")
    job = Job(tmp_path / "run", tf_config_envs(2), 2, *flags)
    job.wait_for_step(4)
    job.kill()
    assert glob.glob(str(tmp_path / "run" / "checkpoints" / "ckpt-3.index")), "no checkpoint before the kill"
    rerun = Job(tmp_path / "run", [{}], 4, *flags)
    assert rerun.wait() == [0], rerun.output(0)[-3000:]
    assert "at step 3" in rerun.output(0)
    assert metrics(tmp_path / "run")["weights_sha256"] == whole["weights_sha256"]
    assert whole["weights_sha256"] != reference["weights_sha256"]  # grouping changed the batches


_EVAL = (
    RESTORED_EVAL
    + r"""
np.savez(sys.argv[2], **{f"logits{i}": o for i, o in enumerate(outputs)},
         **{f"tokens{i}": b["tokens"] for i, b in enumerate(batches)},
         **{f"lengths{i}": b["tokens_length"] for i, b in enumerate(batches)})
"""
)

_CLIENT = r"""
import sys
import numpy as np
import tensorflow as tf

serve = tf.saved_model.load(sys.argv[1]).signatures
saved = np.load(sys.argv[2])
out = {}
for i in range(len([k for k in saved if k.startswith("tokens")])):
    tokens, lengths = saved[f"tokens{i}"][:, :-1], saved[f"lengths{i}"] - 1
    out[f"all{i}"] = serve["serving_default"](tokens=tf.constant(tokens))["logits"].numpy()
    out[f"next{i}"] = serve["next_token"](tokens=tf.constant(tokens), lengths=tf.constant(lengths))["logits"].numpy()
np.savez(sys.argv[3], **out)
"""


def test_the_export_serves_the_logits_eval_computed_in_a_fresh_process(reference, tmp_path):
    model_dir = reference["model_dir"]
    export = os.path.join(model_dir, "export", str(STEPS))
    run = lambda *a: subprocess.run([sys.executable, "-c", *a], cwd=ROOT, capture_output=True, text=True, timeout=300)  # noqa: E731
    evaluated, served = tmp_path / "eval.npz", tmp_path / "served.npz"
    done = run(_EVAL, model_dir, str(evaluated))
    assert done.returncode == 0, done.stderr[-3000:]
    done = run(_CLIENT, export, str(evaluated), str(served))
    assert done.returncode == 0, done.stderr[-3000:]
    ev, sv = np.load(evaluated), np.load(served)
    batches = len([k for k in ev if k.startswith("tokens")])
    assert batches >= 1
    for i in range(batches):
        lengths = ev[f"lengths{i}"] - 1
        logits = ev[f"logits{i}"]
        for row, length in enumerate(lengths):  # real positions; padding's logits are nobody's
            np.testing.assert_allclose(sv[f"all{i}"][row, :length], logits[row, :length], atol=1e-5, rtol=0)
            np.testing.assert_allclose(sv[f"next{i}"][row], logits[row, length - 1], atol=1e-5, rtol=0)


def test_run_json_records_the_text_the_model_learned(paragraphs, reference):
    with open(os.path.join(reference["model_dir"], "run.json")) as f:
        run = json.load(f)
    assert (run["task.name"], run["task.tokens"], run["task.context"]) == ("lm", "char", 32)
    assert run["task.source_sha256"] == paragraphs["sha256"]
    assert run["towers.loss_reduction"] == "weighted_sum"
    assert "model.name" not in run  # --model is classification's; the Transformer's shape is task.*


def test_the_records_name_the_model_the_run_built(reference):
    """metrics.json and the HParams session say the Transformer and its shape, not --model's default (cnn)."""
    built = "transformer (2 layers, 2 heads, width 16, context 32, learned positions)"
    assert reference["model"] == built
    events = event_accumulator.EventAccumulator(reference["model_dir"], size_guidance={event_accumulator.TENSORS: 0})
    events.Reload()
    content = events.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    session = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert session.hparams["model"].string_value == built


def test_a_model_too_large_for_one_device_is_refused_with_its_numbers_and_fits_on_four_stages_with_remat(
    make_config, paragraphs, tmp_path
):
    """--device_memory_mb=7: a language model of width 128 and 4 blocks (Adam: weights, gradients and two slots,
    12.5 MiB) is refused before its first step on one device, naming what it needs; cut into 4 stages each
    device holds a quarter of the state, but 1f1b's first stage keeps 4 micro-batches of its activations (8.3
    MiB), refused too. With --pipeline_remat it keeps only their inputs, recomputes one micro-batch's
    activations in its backward, and the run builds. That a remat pipeline trains (the one-tower bits, at this
    layout) is test_through_pipeline_stages_...[...True...]: a step of this one traced for a minute more."""
    from trainer.loop.build import build
    from trainer.step.memory import device_memory

    def config(num_stages, remat=False, num_towers=4):
        base = _config(make_config, paragraphs, tmp_path, f"wide{num_stages}{remat}", num_towers)
        task = dataclasses.replace(base.task, options={**base.task.option_dict, "layers": 4, "heads": 4, "width": 128})
        towers = dataclasses.replace(base.towers, pipeline_stages=num_stages, pipeline_remat=remat)
        if num_towers == 1:  # one micro-batch of 2 sequences, as each of the 4 towers has: one to trace, not 4
            towers = dataclasses.replace(towers, micro_batches=1, global_batch_size=2)
        runtime = dataclasses.replace(base.runtime, device_memory_mb=7)
        return dataclasses.replace(
            base, task=task, towers=towers, runtime=runtime, optimizer=cfg.OptimizerConfig("adam")
        )

    with pytest.raises(cfg.ConfigError) as refused:
        build(config(1, num_towers=1))
    message = str(refused.value)
    assert re.match(
        r"a step needs ~18\.8 MiB on /device:CPU:0 \(variables, slots and gradients 12\.5 MiB \+ 1 micro-batch", message
    )
    assert (
        "more than --device_memory_mb=7; cut the model over more devices (--pipeline_stages, --tensor_parallel)"
        in message
    )
    with pytest.raises(cfg.ConfigError) as staged:
        build(config(4))
    kept_mib = re.match(
        r"a step needs ~8\.3 MiB on /device:CPU:0 \(.* \+ 4 micro-batch\(es\) x (\d\.\d) MiB", str(staged.value)
    )
    assert kept_mib, str(staged.value)
    trainer = build(config(4, remat=True))
    try:
        needs = device_memory.needs(trainer.updater, trainer.optimizer, 33)
        assert max(n.total for n in needs) <= 7 << 20
        assert [n.in_flight for n in needs] == [4, 3, 2, 1]  # 1f1b, K = 4
        # What a recomputing stage keeps per micro-batch is its inputs, read off the graph: 2 sequences of
        # 33 int32 ids and 2 int32 lengths into the embedding; x (2 x 33 x 128 float32) and the attention
        # mask (2 x 33 x 33 bool) into a block. The last stage keeps its tape: its activations, 1 in flight.
        inputs = [2 * 33 * 4 + 2 * 4] + [2 * 33 * 128 * 4 + 2 * 33 * 33] * 2
        assert [n.kept for n in needs[:3]] == inputs
        assert all(n.recomputed > 0 for n in needs[:3]) and needs[3].recomputed == 0
        assert needs[0].recomputed / 2**20 == pytest.approx(float(kept_mib[1]), abs=0.05)  # what no remat kept
        assert needs[0].total == needs[0].state + 4 * inputs[0] + needs[0].recomputed
        assert sum(n.state for n in needs) == pytest.approx(
            float(re.search(r"gradients (\d+\.\d) MiB", message)[1]) * 2**20, rel=0.01
        )
    finally:
        trainer.updater.close()
