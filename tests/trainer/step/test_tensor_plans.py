"""A model the user brings, split by a built-in plan: a task of their own around Keras Hub's GPT-2 backbone
(benchmarks/harness/hub_tasks.py `HubGPT2`: a block with dropout 0.1, an untied head) trains with `--tensor_parallel=2`
alone, as a user spells it, and at 2 stages x T = 2 cut between the backbone's layers, with the weights of one
device holding both shards; the banner names what the plan split. keras-hub is a test extra.
"""

import json

import pytest

from benchmarks.harness import hub_tasks
from tests.support.runs import cpu_flags, run_trainer

pytest.importorskip("keras_hub")

TASK = "benchmarks.harness.hub_tasks:HubGPT2"
STEPS = 3
SPLIT = (
    "transformer_layer_0/self_attention (heads), transformer_layer_0/feedforward_intermediate_dense (column), "
    "transformer_layer_0/feedforward_output_dense (row)"
)


def test_a_keras_hub_gpt2_in_a_users_task_splits_by_the_built_in_plan_with_the_bits_of_one_device(
    make_config, tmp_path
):
    from trainer.loop.run import train

    train_data, eval_data = hub_tasks.write_records(str(tmp_path))
    common = {"micro_batches": 2, "global_batch_size": 16, "tensor_shards": 2}

    def run(name: str, **towers):
        return train(
            make_config(
                model_dir=tmp_path / name,
                towers={**common, **towers},
                task={"name": TASK},
                data={"train_data": train_data, "eval_data": eval_data},
                loop={"train_steps": STEPS},
            )
        )

    one = run("t1", num_towers=2)
    staged = run("s2t2", num_towers=4, tensor_parallel=2, pipeline_stages=2, pipeline_cuts=("embeddings_dropout",))
    flags = cpu_flags(2, **{"micro_batches": 2, "global_batch_size": 16, "seed": 0, "deterministic": True})
    done = run_trainer(
        *flags,
        *(f"--task={TASK}", "--tensor_parallel=2", f"--train_data={train_data}", f"--eval_data={eval_data}"),
        *(f"--train_steps={STEPS}", "--parameter_device=cpu", "--eval_every_steps=0", "--checkpoint_every_steps=0"),
        *("--export=false", f"--model_dir={tmp_path / 't2'}"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "t2" / "metrics.json").read_text())
    assert two["weights_sha256"] == one["weights_sha256"], "T = 2, from the command line"
    assert staged["weights_sha256"] == one["weights_sha256"], "2 stages x T = 2, cut inside the backbone"
    assert two["eval_loss"] == one["eval_loss"] and staged["eval_loss"] == one["eval_loss"]
    assert two["tensor_parallel"] == {"devices_per_tower": 2, "shards": 2}
    assert staged["pipeline"]["stage_pieces"] == ["token_embedding..embeddings_dropout", "transformer_layer_0..head"]
    assert f"tensor     2 shards per split layer, 1 per device: {SPLIT}\n" in done.stdout


@pytest.mark.quick
def test_a_users_loss_on_whole_logits_works_when_the_head_is_split_by_vocabulary():
    """A task that does not set `vocabulary_shards` gets a split head's logits gathered (`vocab_shards.for_task`):
    its loss, which calls Keras on whole logits, gives the unsplit model's value; the banner tells the gather."""
    import keras
    import numpy as np
    import tensorflow as tf

    from models import layout, vocab_shards
    from trainer.outputs.banner import _tensor_lines
    from trainer.settings.splits import TensorSplit
    from trainer.step.core import micro_batch

    task = hub_tasks.HubGPT2(None)
    keras.utils.set_random_seed(1)
    model = hub_tasks.task_model(hub_tasks.gpt2_backbone(), "users_lm")
    tokens = np.random.default_rng(0).integers(1, hub_tasks.VOCAB, (4, hub_tasks.CONTEXT + 1))
    batch = {"tokens": tf.constant(tokens), "tokens_length": tf.constant([9, 9, 5, 3])}
    unsplit = micro_batch.weighted_sums(task, model(task.model_inputs(batch)), batch)
    model = layout.split(model, (("head", "vocabulary"),), 2)
    assert vocab_shards.gathered_for(task, model) == hub_tasks.VOCAB

    @tf.function  # a shard's backward is built by tf.gradients (models.sharded.run): a graph
    def step():
        values = [v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables]
        result = micro_batch.run_micro_batch(task, model, *values, batch)
        return result.loss, result.weight, result.grads

    loss, weight, grads = step()
    np.testing.assert_allclose(float(loss), float(unsplit[0]), rtol=1e-5)
    assert float(weight) == float(unsplit[1]) == 8 + 8 + 4 + 2
    assert len(grads) == len(model.trainable_variables) and all(g is not None for g in grads)
    lines = _tensor_lines(model, TensorSplit(parallel=1, shards=2), task)
    assert lines[-1] == (
        "tensor     the head's 64 logits per position gathered on shard 0's device for the task's loss, metrics "
        "and serving (it does not set vocabulary_shards: docs/tensor_parallel.md)"
    )
