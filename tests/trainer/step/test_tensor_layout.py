"""A user's model split by name (`--tensor_layout`, `models.layout`) through the engine and the command line.

The built-in mlp on the digits (a functional Keras model, as a user's builder returns) with its two hidden layers
split: `dense1` by columns, `dense2` by rows, 4 shards, 4 micro-batches. One device holding every shard, 2
towers of 2 devices, 2 stages of 2 devices (cut between the two split layers) and, from the command line
spelled as a user spells it, 1 tower of 4 devices train the same weights bit for bit. What cannot be split is
refused in one line, exit 2. Its export at T = 2 serves what its eval computed:
tests/trainer/outputs/test_served_equals_evaluated.py.
"""

import json
import re

import pytest

from tests.support.runs import cpu_flags, run_trainer
from trainer.settings import config as cfg

LAYOUT = ("dense1=column", "dense2=row")
STEPS = 20
MLP = {"name": "mlp"}


def _towers(parallel: int) -> dict:
    return {"num_towers": 4, "micro_batches": 4, "tensor_parallel": parallel, "tensor_shards": 4}


def _roles(*rows) -> list[dict]:
    """metrics.json's `devices`: (tower, pipeline, stage, shards) of /device:CPU:0, 1, ... in turn."""
    keys = ("tower", "pipeline", "stage", "shards")
    rows = [dict(zip(keys, row, strict=True)) for row in rows]
    return [{"device": f"/device:CPU:{i}", "task": 0, **row} for i, row in enumerate(rows)]


def test_the_split_mlp_trains_the_weights_of_one_device_at_every_t(make_config, tmp_path, capsys):
    from trainer.loop.run import train

    def run(parallel: int, stages: int = 1):
        towers = {**_towers(parallel), "tensor_layout": LAYOUT, "pipeline_stages": stages}
        # a directory per run: the staged run in T = 2's would find it complete and train nothing
        run_dir = tmp_path / f"t{parallel}-s{stages}"
        config = make_config(model_dir=run_dir, towers=towers, model=MLP, loop={"train_steps": STEPS})
        return train(config)

    one = run(1)
    # At T = 1 the banner still says the model is kept as shards, and which layers --tensor_layout split.
    banner = "tensor     4 shards per split layer, all on each tower's one device (--tensor_parallel=1): "
    assert f"{banner}dense1 (column), dense2 (row)\n" in capsys.readouterr().out
    two, staged = run(2), run(2, stages=2)
    everything = [0, 1, 2, 3]
    assert one["devices"] == _roles(*((i, i, 0, everything) for i in range(4)))
    assert two["devices"] == _roles((0, 0, 0, [0, 1]), (0, 0, 0, [2, 3]), (1, 1, 0, [0, 1]), (1, 1, 0, [2, 3]))
    assert staged["devices"] == _roles((0, 0, 0, [0, 1]), (0, 0, 0, [2, 3]), (1, 0, 1, [0, 1]), (1, 0, 1, [2, 3]))
    # The settings of `make_config` (tests/conftest.py), spelled as flags.
    flags = cpu_flags(
        4,
        **{"micro_batches": 4, "tensor_parallel": 4, "tensor_shards": 4, "tensor_layout": ",".join(LAYOUT)},
        **{"model": "mlp", "parameter_device": "cpu", "global_batch_size": 64, "seed": 0, "deterministic": True},
        **{"eval_every_steps": 0, "checkpoint_every_steps": 0, "histogram_every_steps": 0, "export": "false"},
    )
    done = run_trainer(*flags, f"--train_steps={STEPS}", f"--model_dir={tmp_path / 't4'}")
    assert done.returncode == 0, done.stderr[-3000:]
    four = json.loads((tmp_path / "t4" / "metrics.json").read_text())
    assert one["weights_sha256"] == two["weights_sha256"], "T = 2"
    assert staged["weights_sha256"] == one["weights_sha256"], "S = 2 x T = 2: the stages' cut between the layers"
    assert four["weights_sha256"] == one["weights_sha256"], "T = 4, from the command line"
    assert four["tensor_parallel"] == {"devices_per_tower": 4, "shards": 4}
    assert "tensor     4 shards per split layer, 1 per device: dense1 (column), dense2 (row)\n" in done.stdout
    assert four["devices"] == _roles(*((0, 0, 0, [i]) for i in range(4)))
    assert one["eval_accuracy"] > 0.5  # it learned (chance: 0.1)


def test_in_bf16_a_split_trains_the_weights_of_one_device(make_config, tmp_path):
    """Under mixed precision each shard's part reads its weights as stored and casts them inside, where the
    gradient follows the cast (read cast outside, the step failed on a gradient of None)."""
    from trainer.loop.run import train

    def run(parallel: int):
        towers = {**_towers(parallel), "tensor_layout": LAYOUT, "mixed_precision": "bf16"}
        return train(
            make_config(model_dir=tmp_path / f"t{parallel}", towers=towers, model=MLP, loop={"train_steps": 4})
        )

    assert run(1)["weights_sha256"] == run(2)["weights_sha256"]


@pytest.mark.quick
@pytest.mark.parametrize(
    "entry, message",
    [
        (
            "dense1=diagonal",
            r"--tensor_layout entry 'dense1=diagonal' must be PATTERN=column, PATTERN=row or PATTERN=heads",
        ),
        ("dense(=row", r"--tensor_layout entry 'dense\(=row': 'dense\(' is not a regular expression"),
    ],
)
def test_a_layout_entry_that_does_not_parse_exits_2_in_one_line(entry, message):
    done = run_trainer(*cpu_flags(4, tensor_parallel=2, tensor_shards=4), f"--tensor_layout={entry}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")
    assert re.search(message, done.stderr), done.stderr[-2000:]


@pytest.mark.parametrize(
    "model, entries, message",
    [
        ("mlp", ("dense3=column",), r"'dense3' matches no layer of model 'mlp'"),
        ("cnn", (".*=row",), r"layer '\w+' is a \w+; row splits a Dense layer"),
    ],
)
def test_a_layout_the_model_cannot_take_is_refused(make_config, model, entries, message):
    from models import ModelError
    from trainer.loop.build import build

    config = make_config(towers={**_towers(2), "tensor_layout": entries}, model={"name": model})
    with pytest.raises(ModelError, match=message) as refused:
        build(config)
    assert "\n" not in str(refused.value)


def test_the_layout_is_part_of_the_model_on_resume(make_config, tmp_path):
    """A run may not resume with another layout: its checkpoint holds that layout's variables."""
    from trainer.loop.run import train

    towers = {**_towers(1), "tensor_layout": LAYOUT}
    train(make_config(model_dir=tmp_path / "run", towers=towers, model=MLP, loop={"train_steps": 2}))
    other = {**towers, "tensor_layout": ("dense1=column",)}
    with pytest.raises(cfg.ConfigError, match="tensor_layout"):
        train(make_config(model_dir=tmp_path / "run", towers=other, model=MLP, loop={"train_steps": 4}))
