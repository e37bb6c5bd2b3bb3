"""Tensor parallelism (`--tensor_parallel=T`, `--tensor_shards=N`, docs/tensor_parallel.md) through the engine.

What the issue promises: at a fixed shard count, every T dividing it gives the weights of one device bit for bit,
with data parallelism (D x T) and pipeline stages (S x T) too; a checkpoint does not depend on T (saved at T = 2,
resumed at T = 4); the step-memory check knows the split (a model refused at T = 1 trains at T = 4, the run
that shows T = 4's bits); what a user can get wrong is refused in one line. The model: the built-in Transformer
on char tokens (a vocabulary of 62, which 4 shards do not divide: every run pads it to 64, so each layout also
shows the padded vocabulary's bits), one block of 4 heads, width 128 (about 4 MiB of variables, slots and
gradients), N = 4. A constant learning rate: the resumed run's first part stops early
without its schedule ending there.
"""

import contextlib
import dataclasses
import io

import pytest

from trainer.settings import config as cfg

N = 4
STEPS = 4


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Char-token records (context 16) of the built-in corpus's first 6,000 characters: every record full, and
    a vocabulary of 62 that N = 4 does not divide, so every layout below trains on the padded vocabulary
    (64 rows: models.vocab_shards)."""
    return _records(tmp_path_factory.mktemp("chars"), "char")


def _records(root, tokens: str) -> dict:
    from data import prepare
    from data import text as text_data

    (root / "text.txt").write_text(text_data.default_corpus()[0][:6000], encoding="utf-8")
    argv = ["text", str(root / "text.txt"), str(root / "records"), "--context=16", f"--tokens={tokens}"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert prepare.main(argv) == 0
    return {"train_data": str(root / "records" / "train-*"), "eval_data": str(root / "records" / "eval-*")}


def _config(make_config, records, model_dir, num_towers: int, parallel: int, stages=1, width=128, **loop):
    config = make_config(
        model_dir=model_dir,
        towers={
            "num_towers": num_towers,
            "micro_batches": 2,
            "global_batch_size": 4,
            "tensor_parallel": parallel,
            "tensor_shards": N,
            "pipeline_stages": stages,
        },
        loop={"train_steps": STEPS, "log_every_steps": STEPS, **loop},
        data=records,
        optimizer={"name": "adamw", "learning_rate": 0.003, "schedule": "constant"},
    )
    task = cfg.TaskConfig(name="lm", options={"layers": 1, "heads": 4, "width": width, "context": 16})
    return dataclasses.replace(config, task=task)


@pytest.fixture(scope="module")
def one_device(make_module_config, records, tmp_path_factory):
    """One device holding all N shards of every layer, K = 2: the weights every layout must give."""
    from trainer.loop.run import train

    return train(_config(make_module_config, records, tmp_path_factory.mktemp("t1") / "run", 1, 1))


@pytest.mark.parametrize(
    "num_towers, parallel, stages",
    [(4, 2, 1), (4, 2, 2)],
    ids=["D2xT2", "S2xT2"],
)
def test_every_split_gives_the_weights_of_one_device(
    make_config, records, one_device, tmp_path, num_towers, parallel, stages
):
    from trainer.loop.run import train

    result = train(_config(make_config, records, tmp_path / "run", num_towers, parallel, stages))
    assert result["weights_sha256"] == one_device["weights_sha256"]
    assert result["train_loss"] == one_device["train_loss"]
    assert result["global_step"] == STEPS
    padding = {"vocabulary": 62, "padded": 64, "shards": N, "rows": 2, "parameters": 2 * 2 * 128}
    assert [r["tensor_parallel"]["vocab_padding"] for r in (result, one_device)] == [padding, padding]


def test_a_run_saved_at_t2_resumes_at_t4_with_the_weights_of_one_device(make_config, records, one_device, tmp_path):
    """The shards are the variables, whatever T: the checkpoint of a T = 2 run is the T = 4 run's."""
    from trainer.loop.run import train

    model_dir = tmp_path / "run"
    first = _config(make_config, records, model_dir, 2, 2, checkpoint_every_steps=2)
    assert train(dataclasses.replace(first, loop=dataclasses.replace(first.loop, train_steps=2)))["global_step"] == 2
    resumed = train(_config(make_config, records, model_dir, 4, 4))
    assert resumed["global_step"] == STEPS
    assert resumed["weights_sha256"] == one_device["weights_sha256"]


def test_the_memory_check_knows_the_split(make_config, records, one_device, tmp_path):
    """Each device of a T = 4 tower holds a quarter of the shards' variables, slots and activations: a budget
    between the two needs refuses T = 1 in one line (the check `build` runs on the counted needs) and trains
    T = 4, with the weights of T = 1 unlimited."""
    from trainer.loop.build import build
    from trainer.loop.run import train
    from trainer.step.memory import device_memory

    def needs(parallel):
        trainer = build(_config(make_config, records, tmp_path / f"probe{parallel}", parallel, parallel))
        return device_memory.needs(trainer.updater, trainer.optimizer, 17)

    whole, split = needs(1), needs(4)
    assert [need.device[-5:] for need in split] == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    largest = max(need.total for need in split)
    assert largest < 0.6 * whole[0].total  # the shards are most of the bytes; LayerNorms etc. stay whole
    assert sum(need.state for need in split) == whole[0].state  # every variable, slot and gradient once
    budget = (whole[0].total + largest) // 2 // device_memory.MIB + 1
    with pytest.raises(cfg.ConfigError, match=r"--tensor_parallel") as refused:
        device_memory.check(whole, budget)
    assert "\n" not in str(refused.value)
    four = _config(make_config, records, tmp_path / "limited4", 4, 4)
    four = dataclasses.replace(four, runtime=dataclasses.replace(four.runtime, device_memory_mb=budget))
    assert train(four)["weights_sha256"] == one_device["weights_sha256"]


SPLIT = {"num_towers": 4, "tensor_parallel": 2}


@pytest.mark.quick
@pytest.mark.parametrize(
    "towers, message",
    [
        ({**SPLIT, "tensor_parallel": 4, "tensor_shards": 2}, r"\(4\) must divide --tensor_shards \(2\)"),
        ({**SPLIT, "num_towers": 3, "tensor_shards": 2}, r"--tensor_parallel \(2\) must divide --num_gpus \(3\)"),
        ({**SPLIT, "update_mode": "async"}, r"needs --update_mode=sync"),
        ({**SPLIT, "parameter_device": "spread"}, r"spread cannot be used"),
        ({**SPLIT, "jit_compile": True}, r"--xla cannot be used"),
        ({**SPLIT, "pipeline_stages": 4}, r"--pipeline_stages \(4\) must divide the towers"),
        ({**SPLIT, "micro_batches": 1}, r"multiple of the towers \(--num_gpus=4 / --tensor_parallel=2\)"),
    ],
)  # fmt: skip
def test_what_a_split_cannot_take_is_refused_in_one_line(make_config, towers, message):
    from trainer.step import modes

    with pytest.raises(cfg.ConfigError, match=message) as refused:
        modes.settle(make_config(towers={"global_batch_size": 8, **towers}))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_model_without_split_layers_is_refused(make_config, tmp_path, parallel):
    """The digits' MLP has no shards: --tensor_shards=2 is refused naming the model and what can split, on one
    device too (where nothing would be placed otherwise, and the setting would do nothing)."""
    from trainer.loop.build import build

    towers = {"num_towers": 2, "tensor_parallel": parallel, "tensor_shards": 2, "global_batch_size": 8}
    config = make_config(towers=towers, model={"name": "mlp"})
    with pytest.raises(cfg.ConfigError, match=r"needs a model whose layers are split into 2 shards; model .* has 1"):
        build(config)


@pytest.mark.quick
def test_shards_that_do_not_divide_the_heads_are_refused():
    """Heads cannot be padded (the vocabulary is: tests/models/test_sharded.py); the line names the plan."""
    from models import layout
    from models.registry import ModelError
    from models.transformer import transformer_lm

    message = (
        "model 'transformer_lm''s built-in tensor plan: --tensor_shards (4) must divide the heads (3) of layer "
        "'block_0/attention': each shard holds whole heads; use a shard count that divides 3"
    )
    with pytest.raises(ModelError) as refused:
        layout.split_model(transformer_lm(65, layers=1, heads=3, width=36, context=8), (), 4)
    assert str(refused.value) == message


def test_two_tasks_of_t2_killed_after_a_checkpoint_resume_in_one_process_at_t4_bitwise(records, one_device, tmp_path):
    """A tower within each machine, data parallel across machines (2 tasks x 1 tower of 2 devices, the shards'
    variables on task 0's), SIGKILLed after its step-2 checkpoint; one process of one tower of 4 devices resumes
    it: the weights of one device."""
    import glob

    from tests.support.cluster import Job, metrics, tf_config_envs

    flags = (
        f"--train_data={records['train_data']}",
        f"--eval_data={records['eval_data']}",
        *("--task=lm", "--lm_layers=1", "--lm_heads=4", "--lm_width=128", "--lm_context=16", "--seed=0"),
        *("--optimizer=adamw", "--learning_rate=0.003", "--lr_schedule=constant", "--global_batch_size=4"),
        *("--micro_batches=2", f"--tensor_shards={N}", f"--train_steps={STEPS}", "--checkpoint_every_steps=2"),
    )
    job = Job(tmp_path / "run", tf_config_envs(2), 2, *flags, "--tensor_parallel=2")
    job.wait_for_step(3)
    job.kill()
    assert glob.glob(str(tmp_path / "run" / "checkpoints" / "ckpt-2.index")), "no checkpoint before the kill"
    rerun = Job(tmp_path / "run", [{}], 4, *flags, "--tensor_parallel=4")
    assert rerun.wait() == [0], rerun.output(0)[-3000:]
    assert "at step 2" in rerun.output(0)
    assert metrics(tmp_path / "run")["weights_sha256"] == one_device["weights_sha256"]
