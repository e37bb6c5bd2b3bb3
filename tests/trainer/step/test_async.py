"""Async update mode: exact step counting, staleness reporting and bounds, failures, signals, resume."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from tests.support.console import on_line
from trainer.loop.build import build
from trainer.loop.run import train
from trainer.step.asynchronous.gate import Gate, Stopped, TowerFailed
from trainer.system.stop import StopRequested


def _async(make_config, num_towers=2, max_staleness=-1, **loop):
    return make_config(
        deterministic=False,
        towers={"num_towers": num_towers, "update_mode": "async", "max_staleness": max_staleness},
        loop={"train_steps": 40, **loop},
    )


@pytest.mark.quick
def test_a_tf_variable_keeps_every_increment_of_concurrent_threads():
    """Why the global step is a raw tf.Variable: its assign_add is one op, atomic under threads. (Keras 3.15's
    `keras.Variable.assign_add` is a read-modify-write in Python that lost ~60% of these increments; that is
    Keras's behaviour, a race that passes or fails by chance, so it is recorded in docs/facts.md, not tested.)"""
    variable, threads, each = tf.Variable(0, dtype=tf.int64), 4, 1000

    def work():
        for _ in range(each):
            variable.assign_add(1)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert int(variable.numpy()) == threads * each


@pytest.mark.quick
def test_step_count_equals_applied_updates_and_staleness_is_reported(make_config, tmp_path):
    metrics = train(_async(make_config, num_towers=4, log_every_steps=20, histogram_every_steps=20))
    assert metrics["global_step"] == 40
    assert metrics["staleness_updates"] == 40  # every applied update counted once, none lost
    assert metrics["update_mode"] == "async"
    # 4 unbounded towers overlap: some updates land on variables others changed since they were read
    assert 0 < metrics["staleness_mean"] <= metrics["staleness_max"] <= 3 * 4
    on_disk = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert on_disk["staleness_max"] == metrics["staleness_max"]
    acc = event_accumulator.EventAccumulator(
        str(tmp_path / "run" / "train"), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    assert {"staleness_mean", "staleness_max", "staleness", "tower_step_sec/tower_3"} <= tags
    assert [e.step for e in acc.Tensors("staleness")] == [1, 20, 40]  # every window: the first step, then 20


def test_max_staleness_zero_is_lock_step(make_config):
    metrics = train(_async(make_config, num_towers=4, max_staleness=0, train_steps=24))
    assert metrics["global_step"] == 24
    assert metrics["staleness_max"] == 0 and metrics["staleness_mean"] == 0.0


def test_max_staleness_bounds_every_update(make_config):
    """At S = 1 two towers compute at once, so updates are stale (a lock-step run, staleness 0, would pass a
    bare `<= 1`), but never by more than 1."""
    metrics = train(_async(make_config, num_towers=4, max_staleness=1, train_steps=40))
    assert metrics["staleness_updates"] == 40
    assert metrics["staleness_max"] == 1 and 0 < metrics["staleness_mean"] <= 1


def test_a_failing_tower_ends_the_run_with_its_number(make_config):
    trainer = build(_async(make_config, num_towers=2))
    healthy = trainer.updater._tower_calls[1]
    calls = []

    def broken(tickets):
        calls.append(1)
        if len(calls) == 3:
            raise tf.errors.InvalidArgumentError(None, None, "corrupt record")
        return healthy(tickets)

    trainer.updater._tower_calls[1] = broken
    try:
        with pytest.raises(TowerFailed, match=r"tower 1 failed: InvalidArgumentError: corrupt record"):
            trainer.updater.train_steps(1000)
    finally:
        trainer.updater.close()
    assert all(not t.is_alive() for t in threading.enumerate() if t.name.startswith("tower-"))


def test_sigint_checkpoints_at_a_step_boundary_and_resume_continues(make_config, tmp_path, monkeypatch):
    """SIGINT is sent when the run prints its step-20 line (an event, not a time: a slow machine only takes
    longer); the run stops at the next step boundary, checkpoints there and says which step it was."""
    config = _async(make_config, train_steps=100_000, log_every_steps=10, checkpoint_every_steps=0)
    sent = on_line(monkeypatch, r"^step\s+20/", lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(StopRequested, match=r"stopped by SIGINT at step (\d+)") as stopped:
        train(config)
    assert sent.fired
    stopped_at = int(tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints")).rsplit("-", 1)[1])
    assert f"at step {stopped_at}" in str(stopped.value)
    assert 20 <= stopped_at < 100_000
    resumed = train(_async(make_config, train_steps=stopped_at + 10))
    assert resumed["global_step"] == stopped_at + 10
    assert resumed["attempts"][-1]["resumed_from_step"] == stopped_at


def _towers(gate, loop, count):
    """Starts `count` threads running `loop` until the gate raises Stopped. Any other exception is kept in
    the thread's list of `errors` and fails the gate, so `wait_window` raises it instead of waiting forever
    (an exception in a thread is otherwise only printed)."""
    errors = [[] for _ in range(count)]

    def run(i):
        try:
            loop()
        except Stopped:
            return
        except BaseException as e:
            errors[i].append(repr(e))
            gate.fail(i, e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    return threads, errors


@pytest.mark.quick
def test_gate_lock_step_runs_one_tower_at_a_time():
    gate, active, peak, order = Gate(max_staleness=0), [0], [0], []
    lock = threading.Lock()

    def tower():
        while True:
            ticket = gate.start()
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.001)
            gate.wait_turn(ticket)
            with lock:
                active[0] -= 1
                order.append(ticket)
            gate.finish(ticket)

    threads, errors = _towers(gate, tower, 3)
    gate.open_window(30)
    gate.wait_window()
    gate.stop()
    for t in threads:
        t.join()
    assert errors == [[], [], []]  # each tower left by Stopped, none by another error
    assert peak[0] == 1 and order == list(range(30))


@pytest.mark.quick
def test_gate_window_applies_exactly_its_budget():
    gate, done = Gate(), []

    def tower():
        while True:
            ticket = gate.start()
            gate.wait_turn(ticket)
            done.append(ticket)
            gate.finish(ticket)

    threads, errors = _towers(gate, tower, 4)
    for window in (7, 1, 12):
        gate.open_window(window)
        gate.wait_window()
        assert len(done) == sum((7, 1, 12)[: (7, 1, 12).index(window) + 1])
    gate.stop()
    for t in threads:
        t.join()
    assert errors == [[], [], [], []]
    assert sorted(done) == list(range(20)) and len(np.unique(done)) == 20


@pytest.mark.quick
def test_gate_shares_shrink_to_one_and_a_halted_call_ends_the_window():
    halts = []
    gate = Gate(halt=lambda: halts.append(1))
    gate.open_window(40)
    shares = [len(gate.start_many(limit=9, parts=4)) for _ in range(5)]
    assert shares == [9, 8, 6, 5, 3]  # at most 9; else ceil(budget / 4) of 40, 31, 23, 17, 12
    assert len(gate.start_many(limit=100, parts=4)) == 3  # ceil(9 / 4)
    assert Gate(max_staleness=2).ordered and not gate.ordered
    last = gate.start_many(limit=100, parts=100)
    assert last == [34]  # ceil(6 / 100)
    gate.finish_many(last, 0)  # a call halted before its update: the ticket leaves the window
    gate.finish_many(list(range(34)), 34)
    assert gate.finished == 34 and halts == []
    gate.wait_window(should_stop=lambda: True)  # the 5 never started leave the window, calls in progress halt
    assert halts == [1] and gate.finished == 34
