"""`python -m benchmarks.probes step_overhead`: where a short step's time goes, in milliseconds per step.

Four loops on one device, the same in-memory cnn-digits batches (global batch 128), timed in alternating
windows of `--steps` steps, median of `--windows`:
  plain                  a `tf.function` step per call, as a user (or Keras's default) writes it
  plain in-graph loop    the same step inside a `tf.range` loop, `--steps` steps per call
  towerflow, 1 per call  towerflow's sync step at `--steps_per_call=1`
  towerflow, auto        towerflow at `--steps_per_call=0` (calls of ~0.5 s)
plain - plain in-graph loop is the cost of a call; towerflow auto - plain in-graph loop is what towerflow's
step does beyond a plain one (stateless_call bookkeeping, the ordered reductions, metrics, checks).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time


def _loops(steps: int) -> tuple[dict, dict]:
    """name -> a function that runs `steps` steps and returns their seconds; and name -> the count of updates
    its optimizer has applied so far, so a window's steps are counted, not assumed."""
    import tensorflow as tf

    from benchmarks.harness import inputs, reference
    from benchmarks.harness import records as records_lib
    from benchmarks.harness.plan import SETTINGS, Side
    from benchmarks.harness.sides import run_config
    from trainer.loop.build import build

    setting = SETTINGS["cnn-digits"]
    records = records_lib.ensure_records(setting)
    plain = reference.PlainSide(setting, inputs.memory_dataset(setting, records, setting.global_batch_size))

    @tf.function
    def plain_loop(iterator, n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            loss = plain._step(iterator)
        return loss

    def timed(run):
        start = time.perf_counter()
        float(run())  # waits for the last step
        return time.perf_counter() - start

    loops = {
        "plain": lambda: plain.window(steps)[0],
        "plain in-graph loop": lambda: timed(lambda: plain_loop(plain.iterator, tf.constant(steps))),
    }
    updates = dict.fromkeys(loops, lambda: int(plain.optimizer.iterations.numpy()))
    for name, steps_per_call in (("towerflow, 1 per call", 1), ("towerflow, auto", 0)):
        config = run_config(Side("towerflow"), setting, records, tempfile.mkdtemp(prefix="towerflow-overhead-"))
        config = dataclasses.replace(config, loop=dataclasses.replace(config.loop, steps_per_call=steps_per_call))
        dataset = inputs.memory_dataset(setting, records, config.towers.micro_batch_size)
        mode = build(config, train_dataset=dataset).updater
        loops[name] = lambda mode=mode: timed(lambda: mode.train_steps(steps).loss)
        updates[name] = lambda mode=mode: int(mode.global_step.numpy())
    return loops, updates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.probes step_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=40, help="steps per timed window")
    parser.add_argument("--windows", type=int, default=9, help="timed windows per loop (after 2 warm-up)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from trainer.system import devices

    devices.configure_logical_cpus(1)  # before any op
    loops, updates = _loops(args.steps)
    for run in loops.values():
        run(), run()  # traces, warms up
    seconds, ran = {name: [] for name in loops}, {name: set() for name in loops}
    for _ in range(args.windows):
        for name, run in loops.items():
            before = updates[name]()
            seconds[name].append(run() / args.steps)
            ran[name].add(updates[name]() - before)
    print(f"load average {os.getloadavg()[0]:.2f}; median of {args.windows} windows of {args.steps} steps")
    for name, values in seconds.items():
        counted = ",".join(str(n) for n in sorted(ran[name]))
        print(f"{name:24s} {statistics.median(values) * 1000:7.2f} ms/step  ({counted} updates a window)")
