"""One run per model_dir: the lock, the resume check of defining flags, the flag history, and TensorBoard
steps that stay strictly increasing across kills and resumes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from tests.support.paths import ROOT
from tests.support.runs import cpu_flags, run_trainer
from trainer.loop.run import train
from trainer.outputs import rundir
from trainer.step.modes import settle


def test_a_second_live_run_is_refused_naming_the_holder(make_config, tmp_path):
    config = make_config(loop={"train_steps": 4})
    os.makedirs(tmp_path / "run")
    with rundir.RunLock(str(tmp_path / "run")), pytest.raises(rundir.RunDirError, match=rf"pid {os.getpid()}"):
        train(config)
    assert not os.path.exists(tmp_path / "run" / "flags.txt")  # a refused run writes nothing
    assert train(config)["global_step"] == 4  # the lock is free again


def test_a_killed_holder_does_not_block(make_config, tmp_path):
    os.makedirs(tmp_path / "run")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from trainer.outputs import rundir; rundir.RunLock({str(tmp_path / 'run')!r}).__enter__(); "
            "import time; time.sleep(600)",
        ],
        cwd=ROOT,
    )
    deadline = time.monotonic() + 30
    while "pid" not in (tmp_path / "run" / ".lock").read_text() if (tmp_path / "run" / ".lock").exists() else True:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(rundir.RunDirError, match=f"pid {holder.pid}"):
        train(make_config(loop={"train_steps": 2}))
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert train(make_config(loop={"train_steps": 2}))["global_step"] == 2


def test_resume_with_other_defining_flags_is_refused_unless_allowed(make_config, tmp_path, capsys):
    train(make_config(seed=1, loop={"train_steps": 4, "checkpoint_every_steps": 2}))
    with pytest.raises(rundir.RunDirError, match=r"\(--learning_rate: 0.05 -> 0.1; --seed: 1 -> 2\)"):
        train(make_config(seed=2, optimizer={"learning_rate": 0.1}, loop={"train_steps": 8}))
    # cadences, the step budget and (sync, K fixed) the tower count may change
    resumed = train(
        make_config(seed=1, towers={"num_towers": 1, "micro_batches": 2}, loop={"train_steps": 6, "log_every_steps": 3})
    )
    assert resumed["global_step"] == 6
    allowed = train(make_config(seed=2, loop={"train_steps": 8, "allow_flag_changes": True}))
    assert allowed["global_step"] == 8
    assert "resuming with changed settings (--allow_flag_changes): --seed: 1 -> 2" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / rundir.RUN_FILE).read_text())["seed"] == 2


def test_cli_refusal_keeps_flags_txt_and_history_grows_per_start(tmp_path):
    common = cpu_flags(train_steps=4, eval_every_steps=0, export=False)
    assert run_trainer(*common, "--seed=3", f"--model_dir={tmp_path}/run").returncode == 0
    refused = run_trainer(*common, "--seed=4", f"--model_dir={tmp_path}/run")
    assert refused.returncode == 2 and "--seed: 3 -> 4" in refused.stderr and "Traceback" not in refused.stderr
    assert "--seed=3\n" in (tmp_path / "run" / "flags.txt").read_text()
    assert (
        run_trainer(*common[:2], "--train_steps=6", "--seed=3", "--noexport", f"--model_dir={tmp_path}/run").returncode
        == 0
    )
    history = (tmp_path / "run" / "flags.history").read_text()
    assert history.count("# start: host") == 2 and "--train_steps=4\n" in history and "--train_steps=6\n" in history


def _steps(directory, tag):
    acc = event_accumulator.EventAccumulator(str(directory), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return [e.step for e in acc.Tensors(tag)] if tag in acc.Tags()["tensors"] else []


def test_tensorboard_steps_stay_increasing_after_a_kill_and_resume(make_config, tmp_path):
    loop = {"train_steps": 20, "log_every_steps": 5, "eval_every_steps": 5, "checkpoint_every_steps": 10}
    train(make_config(loop=loop))
    run = tmp_path / "run"
    # the run killed after step 20's events but before its checkpoint: only ckpt-10 is left
    for name in os.listdir(run / "checkpoints"):
        if name.startswith("ckpt-20."):
            os.remove(run / "checkpoints" / name)
    tf.compat.v1.train.update_checkpoint_state(str(run / "checkpoints"), str(run / "checkpoints" / "ckpt-10"))
    shutil.rmtree(run / "export", ignore_errors=True)
    train(make_config(loop=loop))
    assert _steps(run / "train", "loss") == [1, 5, 10, 11, 15, 20]  # each start logs its first step
    assert _steps(run / "eval", "accuracy") == [5, 10, 15, 20]
    # the settings and the chart layout (in model_dir itself) recorded once, by the resumed start
    acc = event_accumulator.EventAccumulator(str(run), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    for tag in ("_hparams_/session_start_info", "_hparams_/experiment", "custom_scalars__config__"):
        assert len(acc.Tensors(tag)) == 1, tag


def test_a_setting_the_recorded_run_predates_counts_as_its_default(make_config, tmp_path):
    train(make_config(loop={"train_steps": 2, "checkpoint_every_steps": 2}))
    path = tmp_path / "run" / rundir.RUN_FILE
    recorded = json.loads(path.read_text())
    del recorded["data.shuffle_buffer"], recorded["seed"]  # as a run.json written before these settings existed
    path.write_text(json.dumps(recorded))
    assert train(make_config(loop={"train_steps": 4}))["global_step"] == 4
    path.write_text(json.dumps({**recorded, "seed": 9}))
    with pytest.raises(rundir.RunDirError, match=r"--seed: 9 -> 0"):
        train(make_config(loop={"train_steps": 6}))


def _old_run(make_config, tmp_path, model: str, **recorded_changes):
    """A model_dir with a checkpoint and the run.json of a `model` run written before --augment and
    --normalize existed (no keys for them): those runs scaled pixels by 1/255 and did nothing else."""
    run = tmp_path / "run"
    os.makedirs(run / "checkpoints")
    (run / "checkpoints" / "ckpt-2.index").write_bytes(b"")
    recorded = rundir.defining_settings(settle(make_config(model={"name": model})))
    del recorded["data.augment"], recorded["data.normalize"]
    (run / rundir.RUN_FILE).write_text(json.dumps({**recorded, **recorded_changes}))
    return run


def test_a_run_from_before_augmentation_is_not_resumed_with_auto_augmentation(make_config, tmp_path):
    run = _old_run(make_config, tmp_path, "resnet20")
    resnet20 = make_config(model={"name": "resnet20"})
    with pytest.raises(rundir.RunDirError) as refused:
        rundir.check_resume(settle(resnet20), allow_changes=False)
    message = str(refused.value)
    assert "(--augment: 'none' -> 'crop_flip' (auto for resnet20))" in message
    assert f"(--flagfile={run / 'flags.txt'} --augment=none)" in message and "--allow_flag_changes" in message
    none = make_config(model={"name": "resnet20"}, data={"augment": "none", "cache": "none"})  # cache: free
    rundir.check_resume(settle(none), allow_changes=False)
    assert json.loads((run / rundir.RUN_FILE).read_text())["data.augment"] == "none"  # resolved, not "auto"


def test_a_run_from_before_augmentation_resumes_where_auto_means_none(make_config, tmp_path, capsys):
    run = _old_run(make_config, tmp_path, "cnn")
    rundir.check_resume(settle(make_config()), allow_changes=False)  # cnn: auto is none, as the old run did
    with pytest.raises(rundir.RunDirError, match=r"\(--augment: 'none' -> 'flip'; --normalize: 'none' -> 'imagenet'\)"):
        rundir.check_resume(settle(make_config(data={"augment": "flip", "normalize": "imagenet"})), allow_changes=False)
    rundir.check_resume(settle(make_config(data={"augment": "flip"})), allow_changes=True)
    assert "(--allow_flag_changes): --augment: 'none' -> 'flip'" in capsys.readouterr().out
    assert json.loads((run / rundir.RUN_FILE).read_text())["data.augment"] == "flip"


def test_augmentation_and_normalization_compare_as_resolved(make_config, tmp_path):
    """A run.json written with the literal flags (`auto`, a normalization's numbers) before this check
    compared resolved values: the same training resumes whatever the spelling, another is refused."""
    _old_run(make_config, tmp_path, "resnet20", **{"data.augment": "auto", "data.normalize": "imagenet"})
    imagenet = "0.485,0.456,0.406,0.229,0.224,0.225"
    same = make_config(model={"name": "resnet20"}, data={"augment": "crop_flip", "normalize": imagenet})
    rundir.check_resume(settle(same), allow_changes=False)
    other = make_config(model={"name": "resnet20"}, data={"normalize": "0.5,0.5,0.5,0.25,0.25,0.25"})
    with pytest.raises(rundir.RunDirError, match=r"\(--normalize: 'imagenet' -> '0.5,0.25'\).*--normalize=imagenet\)"):
        rundir.check_resume(settle(other), allow_changes=False)


def test_cli_refuses_auto_augmentation_on_a_run_from_before_it(tmp_path):
    common = cpu_flags(num_gpus=1, global_batch_size=16, train_steps=1, export=False)
    common += ["--model=resnet20", "--eval_every_steps=0", f"--model_dir={tmp_path}/run"]
    assert run_trainer(*common, "--augment=none").returncode == 0
    path = tmp_path / "run" / rundir.RUN_FILE
    recorded = json.loads(path.read_text())
    del recorded["data.augment"], recorded["data.normalize"]  # as before augmentation (cache is never recorded)
    path.write_text(json.dumps(recorded))
    refused = run_trainer(*common[:3], "--train_steps=2", *common[4:])  # --augment=auto (the default)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--augment: 'none' -> 'crop_flip' (auto for resnet20)" in refused.stderr
    assert "--augment=none), use a new --model_dir, or pass --allow_flag_changes" in refused.stderr
    assert run_trainer(*common[:3], "--train_steps=2", *common[4:], "--augment=none").returncode == 0


def _chain_run(make_config, tmp_path, **config):
    """A model_dir with a checkpoint and the run.json of a run from before the tree sum (no gradient order)."""
    run = tmp_path / "run"
    os.makedirs(run / "checkpoints")
    (run / "checkpoints" / "ckpt-2.index").write_bytes(b"")
    recorded = rundir.defining_settings(settle(make_config(**config)))
    recorded.pop("towers.gradient_order", None)  # async records none: its updates sum nothing
    (run / rundir.RUN_FILE).write_text(json.dumps(recorded))
    return run


def test_a_run_summed_left_to_right_is_not_resumed_with_the_tree_unless_allowed(make_config, tmp_path, capsys):
    four = make_config(towers={"num_towers": 2, "micro_batches": 4})
    run = _chain_run(make_config, tmp_path, towers={"num_towers": 2, "micro_batches": 4})
    with pytest.raises(
        rundir.RunDirError, match=r"\(the order of the gradient sum \(docs/determinism.md\): 'chain' -> 'tree'\)"
    ):
        rundir.check_resume(settle(four), allow_changes=False)
    rundir.check_resume(settle(four), allow_changes=True)
    assert "the order of the gradient sum (docs/determinism.md): 'chain' -> 'tree'" in capsys.readouterr().out
    assert json.loads((run / rundir.RUN_FILE).read_text())["towers.gradient_order"] == "tree"


@pytest.mark.parametrize(
    "towers",
    [
        {"num_towers": 1, "micro_batches": 3, "global_batch_size": 48},
        {"num_towers": 4, "update_mode": "async", "micro_batches": 4},
    ],
)
def test_where_the_orders_agree_a_left_to_right_run_resumes(make_config, tmp_path, towers):
    """Up to 3 micro-batches the chain is the tree; async sums nothing."""
    deterministic = towers.get("update_mode") != "async"  # async refuses --deterministic (its mode's check)
    _chain_run(make_config, tmp_path, towers=towers, deterministic=deterministic)
    rundir.check_resume(settle(make_config(towers=towers, deterministic=deterministic)), allow_changes=False)


# What 0.7.0 recorded for every run, whatever its task: the language model's sizes were engine settings then.
LM_SIZES_OF_070 = {
    "task.layers": 4,
    "task.heads": 4,
    "task.width": 128,
    "task.context": 64,
    "task.positions": "learned",
    "task.dropout": 0.0,
}


def _run_json(make_config, tmp_path, config, **recorded_changes):
    """A model_dir with a checkpoint and `config`'s run.json, changed by `recorded_changes`."""
    run = tmp_path / "run"
    os.makedirs(run / "checkpoints")
    (run / "checkpoints" / "ckpt-2.index").write_bytes(b"")
    recorded = rundir.defining_settings(settle(config))
    (run / rundir.RUN_FILE).write_text(json.dumps({**recorded, **recorded_changes}))
    return run


def test_the_language_models_sizes_define_an_lm_run_and_no_other(make_config, tmp_path):
    """The sizes are the lm task's arguments: an lm run records them and refuses another width; a classification
    run records none, and resumes a run.json of 0.7.0 that carries them."""
    lm = make_config(task={"name": "lm"})
    assert {k: v for k, v in rundir.defining_settings(settle(lm)).items() if k in LM_SIZES_OF_070} == LM_SIZES_OF_070
    assert not set(rundir.defining_settings(settle(make_config()))) & set(LM_SIZES_OF_070)
    run = _run_json(make_config, tmp_path, make_config(), **LM_SIZES_OF_070)
    rundir.check_resume(settle(make_config()), allow_changes=False)  # classification, from 0.7.0
    assert not set(json.loads((run / rundir.RUN_FILE).read_text())) & set(LM_SIZES_OF_070)
    shutil.rmtree(run)
    _run_json(make_config, tmp_path, lm)
    rundir.check_resume(settle(lm), allow_changes=False)
    shutil.rmtree(run := tmp_path / "run")
    recorded_before_the_preset = rundir.defining_settings(settle(lm))
    del recorded_before_the_preset["task.preset"]
    _run_json(make_config, tmp_path, lm)
    (run / rundir.RUN_FILE).write_text(json.dumps(recorded_before_the_preset))
    rundir.check_resume(settle(lm), allow_changes=False)  # --lm_preset is newer: the run had its default
    gpt2 = make_config(task={"name": "lm", "options": {"preset": "gpt2-small"}})
    with pytest.raises(rundir.RunDirError, match=r"--lm_preset: 'none' -> 'gpt2-small'"):
        rundir.check_resume(settle(gpt2), allow_changes=False)
    wider = make_config(task={"name": "lm", "options": {"width": 64, "heads": 2}})
    with pytest.raises(rundir.RunDirError, match=r"\(--lm_heads: 4 -> 2; --lm_width: 128 -> 64\)"):
        rundir.check_resume(settle(wider), allow_changes=False)


@pytest.mark.quick
def test_model_is_recorded_only_for_a_task_that_builds_its_model_by_name(make_config, tmp_path):
    """--model is classification's (`Task.named_model`): a task building its own model records no `model.name`
    (0.7.0 recorded `cnn` for every task), resumes a run.json of 0.7.0 that holds it, and one of its own; a
    named model still refuses another."""
    lm = make_config(task={"name": "lm"})
    run = _run_json(make_config, tmp_path, lm)
    assert json.loads((run / rundir.RUN_FILE).read_text())["model.name"] == "cnn"  # as 0.7.0 wrote it
    for _ in range(2):  # 0.7.0's run.json, then the one the first resume wrote
        rundir.check_resume(settle(lm), allow_changes=False, model_by_name=False)
        assert "model.name" not in json.loads((run / rundir.RUN_FILE).read_text())
    shutil.rmtree(run)
    _run_json(make_config, tmp_path, make_config())  # classification's cnn
    with pytest.raises(rundir.RunDirError, match=r"would change \(--model: 'cnn' -> 'mlp'\)"):
        rundir.check_resume(settle(make_config(model={"name": "mlp"})), allow_changes=False)


@pytest.mark.quick
def test_a_long_task_fact_is_cut_in_the_resume_message():
    """A subword model travels in run.json as base64 (~100 KB): a refusal shows its ends, not all of it."""
    model = "A" * 50_000 + "Z"
    assert rundir._short(model) == f"{repr(model)[:60]}...{repr(model)[-60:]} (50003 characters)"
    assert rundir._short("bpe") == "'bpe'" and rundir._short(None) == "None"


SUBWORD_FACTS = {"source_sha256": "1" * 64, "tokens": "subword", "vocab_size": 2000, "vocab": None}


@pytest.mark.quick
@pytest.mark.parametrize(
    "now, allow, words, suggested",
    [
        (  # another vocabulary: the weights cannot load, so --allow_flag_changes is neither offered nor taken
            {**SUBWORD_FACTS, "vocab_size": 1000, "subword_model": "B" * 9000, "subword_model_sha256": "b" * 64},
            True,
            "the data's subword model sha256: aaaaaaaaaaaa -> bbbbbbbbbbbb; the data's vocab size: 2000 -> 1000): "
            "its weights are for another vocabulary",
            False,
        ),
        (  # the same vocabulary over another text: a resume on it may be asked for
            {**SUBWORD_FACTS, "source_sha256": "2" * 64, "subword_model": "A" * 9000, "subword_model_sha256": "a" * 64},
            False,
            "holds a run of other data (the data's source sha256: 111111111111 -> 222222222222). Resume",
            True,
        ),
    ],
    ids=["vocabulary", "text"],
)
def test_a_resume_on_other_data_says_what_of_the_data_changed(make_config, tmp_path, now, allow, words, suggested):
    """The task's facts are named as the data's, in words (a hash by 12 digits, never the model's base64), not as
    flags; --allow_flag_changes is suggested only where it can resume."""
    lm = make_config(task={"name": "lm"})
    before = {**SUBWORD_FACTS, "subword_model": "A" * 9000, "subword_model_sha256": "a" * 64}
    _run_json(make_config, tmp_path, lm, **{f"task.{k}": v for k, v in before.items()})
    facts = {"task_facts": now, "model_facts": ("tokens", "vocab_size", "vocab", "subword_model_sha256")}
    with pytest.raises(rundir.RunDirError) as refused:
        rundir.check_resume(settle(lm), allow_changes=allow, **facts)
    message = str(refused.value)
    assert words in message and "AAAA" not in message and "--subword_model" not in message, message
    assert ("--allow_flag_changes" in message) == suggested, message
