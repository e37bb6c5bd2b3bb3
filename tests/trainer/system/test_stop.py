"""Stop signals: honoured after the current step, a save is never cut short, the final checkpoint comes
before the final eval, an early signal exits cleanly, and the attempts of a run are recorded."""

import gc
import json
import os
import signal
import subprocess
import threading
import time

import pytest
import tensorflow as tf

from tests.support.paths import ROOT
from tests.support.runs import cpu_flags, trainer_command
from trainer.loop import run as run_lib
from trainer.loop.evaluate import Evaluator
from trainer.outputs.checkpoint import Checkpointer
from trainer.step.asynchronous.async_update import AsyncUpdate
from trainer.system import stop as stop_lib


class StepAtSignal(stop_lib.StopRequest):
    """Records the global step when Python runs the handler (after the TensorFlow call in progress)."""

    def __init__(self, trainers):
        super().__init__()
        self.trainers = trainers
        self.steps_at_signal = []
        self.seen = []  # every signal, kept after the run (`signals` is cleared when train() returns)

    def handle(self, signum, frame=None):
        self.seen.append(signum)
        self.steps_at_signal.append(int(self.trainers[-1].global_step.numpy()) if self.trainers else None)
        super().handle(signum, frame)


@pytest.fixture
def built(monkeypatch):
    """The Trainer objects `train()` builds, in order."""
    trainers = []
    original = run_lib.build

    def capture(config, *args, **kwargs):
        trainers.append(original(config, *args, **kwargs))
        return trainers[-1]

    monkeypatch.setattr(run_lib, "build", capture)
    return trainers


def _kill_when(predicate, signum=signal.SIGTERM, timeout_sec=60.0):
    """Sends `signum` to this process once `predicate()` holds; returns a dict that gets the send time."""
    sent = {}

    def wait_and_kill():
        deadline = time.monotonic() + timeout_sec
        while not predicate() and time.monotonic() < deadline:
            time.sleep(0.01)
        sent["at"] = time.monotonic()
        os.kill(os.getpid(), signum)

    threading.Thread(target=wait_and_kill, daemon=True).start()
    return sent


def _wait_until_caught(process, signum, timeout_sec=60.0) -> None:
    """Waits until `process` has a handler for `signum` (Linux: the SigCgt mask of /proc/PID/status)."""
    deadline = time.monotonic() + timeout_sec
    while process.poll() is None and time.monotonic() < deadline:
        with open(f"/proc/{process.pid}/status") as status:
            caught = next(line for line in status if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) >> (signum - 1) & 1:
            return
        time.sleep(0.005)
    raise AssertionError(f"the process never caught signal {signum} (exit code {process.poll()})")


def _latest_step(model_dir) -> int:
    return int(tf.train.latest_checkpoint(str(model_dir / "checkpoints")).rsplit("-", 1)[1])


@pytest.mark.parametrize(
    "update_mode, steps_per_call",
    [("sync", 0), ("sync", 100_000), ("async", 0)],
    ids=["sync-auto", "sync-one-call-per-window", "async"],
)
def test_stop_lands_after_the_step_in_progress_not_after_the_window(
    make_config, tmp_path, built, monkeypatch, update_mode, steps_per_call
):
    """With one call for a 5,000-step window, only the in-graph interrupt can stop it after one step."""
    saves = []  # (seconds, time.monotonic() at its end) of every save the run makes: the stop's is the last
    original_save = Checkpointer.save

    def timed_save(self):
        start = time.monotonic()
        path = original_save(self)
        saves.append((time.monotonic() - start, time.monotonic()))
        return path

    monkeypatch.setattr(Checkpointer, "save", timed_save)
    halted_at = []  # async: the global step each time the towers' halt flag is set (first: by the watcher)
    original_interrupt = AsyncUpdate.interrupt

    def recorded_interrupt(self):
        original_interrupt(self)  # the flag first: a step read before it counted the updates between the two
        halted_at.append(int(self.global_step.numpy()))

    monkeypatch.setattr(AsyncUpdate, "interrupt", recorded_interrupt)
    config = make_config(
        deterministic=update_mode == "sync",
        towers={"update_mode": update_mode},
        loop={
            "train_steps": 100_000,
            "log_every_steps": 5_000,
            "checkpoint_every_steps": 0,
            "steps_per_call": steps_per_call,
        },
    )
    stop = StepAtSignal(built)
    gc.collect()  # late in a long test session a collection of earlier tests' objects can take seconds
    sent = _kill_when(lambda: built and int(built[-1].global_step.numpy()) >= 40)
    with pytest.raises(stop_lib.StopRequested, match=r"stopped by SIGTERM at step (\d+); checkpoint .* saved") as e:
        run_lib.train(config, stop=stop)
    save_sec, durable_at = saves[-1]
    latency_sec = durable_at - sent["at"]  # signal -> the checkpoint is on disk
    stopped_at = _latest_step(tmp_path / "run")
    assert e.value.step == stopped_at and stopped_at < 5_000
    # sync: nothing runs after the step the signal interrupted (the handler runs when that call returns).
    # async: counted from the halt flag, not from the handler, which runs on the main thread while the towers
    # keep updating and can read the step before the watcher thread sets the flag (5 updates apart once in a
    # loaded suite run): the updates in flight then land, and a tower whose in-graph loop read the flag just
    # before it was set starts one more (at most two per tower, 2 towers)
    if update_mode == "sync":
        assert stopped_at == stop.steps_at_signal[0]
    else:
        assert halted_at and 0 <= stopped_at - halted_at[0] <= 4, (halted_at, stopped_at)
    assert len(saves) == 1  # the stop's checkpoint, and no other
    attempts = json.loads((tmp_path / "run" / "attempts.json").read_text())
    assert [a["step"] for a in attempts] == [stopped_at]
    assert attempts[0]["outcome"] == f"stopped by signal 15 at step {stopped_at}"
    print(f"{update_mode}: step {stopped_at}, signal -> checkpoint {latency_sec:.3f} s, save {save_sec:.3f} s")
    assert latency_sec < 60  # a hang guard only: the steps above are what this test checks


@pytest.mark.quick
def test_a_signal_reaches_a_graph_loop_while_python_handlers_wait():
    """Python runs a signal's handler only when the TensorFlow call in progress returns; `notifying` calls
    back at once, so a loop inside one call stops after its current iteration. Iteration 50 of the loop sends
    the signal and waits (up to 30 s) for the callback before it ends: the loop must stop right after it."""
    interrupted = tf.Variable(False)
    stop = stop_lib.StopRequest()
    called_back = threading.Event()

    def iteration(i):
        if int(i) == 50:
            os.kill(os.getpid(), signal.SIGUSR2)
            called_back.wait(30)
        return i

    @tf.function
    def spin():
        def one(i):
            with tf.control_dependencies([tf.py_function(iteration, [i], tf.int32)]):
                return i + 1

        return tf.while_loop(lambda i: tf.logical_and(i < 3000, tf.logical_not(interrupted)), one, [0])

    def callback():
        interrupted.assign(True)
        called_back.set()

    with stop.handling(), stop.notifying(callback):
        iterations = int(spin()[0])  # 3,000 iterations unless interrupted
        assert stop.signals == [signal.SIGUSR2]  # the handler ran once the call returned
    assert called_back.is_set() and iterations == 51  # iterations 0..50: none after the one that was signalled


def test_a_second_signal_during_the_save_lets_the_save_finish(make_config, tmp_path, monkeypatch, built):
    original_save = Checkpointer.save

    def save_while_signalled(self):
        os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of the save
        return original_save(self)

    monkeypatch.setattr(Checkpointer, "save", save_while_signalled)
    config = make_config(loop={"train_steps": 100_000, "log_every_steps": 5_000})
    stop = StepAtSignal([])
    _kill_when(lambda: built and int(built[-1].global_step.numpy()) >= 5)
    with pytest.raises(stop_lib.StopRequested, match="stopped by SIGTERM"):
        run_lib.train(config, stop=stop)
    assert stop.seen == [signal.SIGTERM, signal.SIGINT]
    step = _latest_step(tmp_path / "run")
    assert step >= 5  # the step the signal waited for, or one after it
    resumed = run_lib.train(make_config(loop={"train_steps": step + 2}))  # the checkpoint reads back whole
    assert resumed["global_step"] == step + 2 and resumed["attempts"][1]["resumed_from_step"] == step


def test_signal_during_the_final_eval_finishes_the_run_with_its_checkpoint(make_config, tmp_path, monkeypatch):
    original = Evaluator.evaluate

    def evaluate(self, should_stop=None, progress=None):
        if should_stop is None:  # the final eval
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, should_stop, progress)

    monkeypatch.setattr(Evaluator, "evaluate", evaluate)
    metrics = run_lib.train(make_config(loop={"train_steps": 12}))
    assert metrics["global_step"] == 12 and metrics["eval_examples"] == 360
    assert _latest_step(tmp_path / "run") == 12
    assert metrics["attempts"][-1]["outcome"] == "finished"


@pytest.mark.quick
def test_an_eval_during_training_gives_way_to_a_stop(make_config, tmp_path, monkeypatch):
    original = Evaluator.evaluate

    def evaluate(self, should_stop=None, progress=None):
        if should_stop is not None:
            os.kill(os.getpid(), signal.SIGUSR2)
        return original(self, should_stop, progress)

    monkeypatch.setattr(Evaluator, "evaluate", evaluate)
    config = make_config(loop={"train_steps": 40, "eval_every_steps": 10, "checkpoint_every_steps": 10})
    with pytest.raises(stop_lib.StopRequested, match="stopped by SIGUSR2 at step 10"):
        run_lib.train(config)
    attempts = json.loads((tmp_path / "run" / "attempts.json").read_text())
    assert attempts[0]["step"] == 10
    assert attempts[0]["outcome"].startswith("stopped by signal 12 at step 10; not requeued: not a Slurm job")


@pytest.mark.quick
def test_cli_signal_during_imports_exits_resumable(tmp_path):
    process = subprocess.Popen(
        trainer_command(*cpu_flags(num_gpus=None), f"--model_dir={tmp_path}/run"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Sent once the trainer catches SIGTERM (its handlers come first, before TensorFlow is imported), not
    # after a fixed time: sooner, the default action would kill it; later, a slow machine's import is done.
    _wait_until_caught(process, signal.SIGTERM)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == stop_lib.EXIT_RESUMABLE, output[-2000:]
    assert "stopped by SIGTERM before the model was built; nothing to save" in output
    assert not os.path.exists(tmp_path / "run" / "checkpoints")
