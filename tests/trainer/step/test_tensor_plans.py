"""A model the user brings, split by a built-in plan: a task of their own around Keras Hub's GPT-2 backbone
(tests/support/hub_tasks.py) trains with `--tensor_parallel=2` alone, as a user spells it, and the weights are
those of one device holding both shards; the banner names what the plan split. keras-hub is a test extra.
"""

import json

import pytest

from tests.support import hub_tasks
from tests.support.runs import cpu_flags, run_trainer

pytest.importorskip("keras_hub")

TASK = "tests.support.hub_tasks:TiedGPT2"
STEPS = 6


def test_a_keras_hub_gpt2_in_a_users_task_splits_by_the_built_in_plan_with_the_bits_of_one_device(
    make_config, tmp_path
):
    from trainer.loop.run import train

    train_data, eval_data = hub_tasks.write_records(str(tmp_path))
    towers = {"num_towers": 2, "micro_batches": 2, "global_batch_size": 16, "tensor_shards": 2}
    one = train(
        make_config(
            model_dir=tmp_path / "t1",
            towers=towers,
            task={"name": TASK},
            data={"train_data": train_data, "eval_data": eval_data},
            loop={"train_steps": STEPS},
        )
    )
    flags = cpu_flags(2, **{"micro_batches": 2, "global_batch_size": 16, "seed": 0, "deterministic": True})
    done = run_trainer(
        *flags,
        f"--task={TASK}",
        "--tensor_parallel=2",
        f"--train_data={train_data}",
        f"--eval_data={eval_data}",
        f"--train_steps={STEPS}",
        *("--parameter_device=cpu", "--eval_every_steps=0", "--checkpoint_every_steps=0", "--export=false"),
        f"--model_dir={tmp_path / 't2'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "t2" / "metrics.json").read_text())
    assert two["weights_sha256"] == one["weights_sha256"]
    assert two["eval_loss"] == one["eval_loss"]
    assert two["tensor_parallel"] == {"devices_per_tower": 2, "shards": 2}
    split = ", ".join(
        f"transformer_layer_{i}/{name}"
        for i in (0, 1)
        for name in (
            "self_attention (heads)",
            "feedforward_intermediate_dense (column)",
            "feedforward_output_dense (row)",
        )
    )
    assert f"tensor     2 shards per split layer, 1 per device: {split}\n" in done.stdout
