"""`python -m benchmarks.probes async_overhead`: where an async update's time goes, in milliseconds per update.

The same in-memory cnn-digits micro-batches (global batch 128, one micro-batch per tower: 128 / N examples
per update), timed in alternating windows of `--updates` updates, median of `--windows`:
  sync, per micro-batch        towerflow's sync step / N (the reference: the same examples per update)
  async, N towers              the async mode as trained (N threads, several updates per call)
  1 tower: compute only        one tower alone, an in-graph loop of forward/backward passes, no apply
  1 tower: compute + apply     one tower alone, the in-graph loop of the async mode (apply in its critical
                               section)
  1 tower: 1 update per call   one tower alone, a compute call then an apply call per update and its
                               results read on the host (what every update cost before several per call)
Wall milliseconds, and CPU milliseconds of the process (both cores), which other load on the machine changes
less. Differences: apply = (compute + apply) - (compute only); a call per update = (1 per call) - (compute + apply).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time


def _loops(towers: int, updates: int) -> dict:
    """name -> a function that runs `updates` updates (micro-batches) and returns their seconds."""
    import tensorflow as tf

    from benchmarks.harness import records as records_lib
    from benchmarks.harness.plan import SETTINGS, Side
    from benchmarks.harness.sides import TowerflowSide

    setting = SETTINGS["cnn-digits"]
    records = records_lib.ensure_records(setting)
    sync = TowerflowSide(Side("towerflow", towers), setting, records, tempfile.mkdtemp(prefix="towerflow-async-"))
    side = TowerflowSide(Side("towerflow", towers, update_mode="async"), setting, records, tempfile.mkdtemp())
    mode = side.updater

    @tf.function
    def compute_only(n):
        def body(i, total):  # every gradient summed: a pass whose gradients nobody used would be pruned
            loss, _, grads, _, _ = mode.graph.compute(0)
            return i + 1, total + loss + tf.add_n([tf.reduce_sum(g) for g in grads])

        return tf.while_loop(lambda i, _: i < n, body, (0, tf.constant(0.0)), parallel_iterations=1)[1]

    def one_per_call():
        loss, metrics, grads, non_trainable, read_step = mode.compute_call(0)
        m = mode.apply_call(loss, grads, non_trainable, read_step)
        return bool(m["finite"]), int(m["step"]), float(loss), float(metrics["accuracy"][0]), float(m["grad_norm"])

    def timed(run):
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    steps = max(1, updates // towers)  # global batches: `updates` micro-batches
    return {
        "sync, per micro-batch": lambda: sync.window(steps)[0] * updates / (steps * towers),
        f"async, {towers} towers": lambda: side.window(steps)[0] * updates / (steps * towers),
        "1 tower: compute only": lambda: timed(lambda: float(compute_only(tf.constant(updates)))),
        "1 tower: compute + apply": lambda: timed(functools.partial(mode.chained_updates, 0, list(range(updates)))),
        "1 tower: 1 update per call": lambda: timed(lambda: [one_per_call() for _ in range(updates)]),
    }, (sync, side)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.probes async_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--towers", type=int, default=2, help="towers (logical CPU devices) of both modes")
    parser.add_argument("--updates", type=int, default=80, help="updates (micro-batches) per timed window")
    parser.add_argument("--windows", type=int, default=9, help="timed windows per loop (after 2 warm-up)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from trainer.system import devices

    devices.configure_logical_cpus(args.towers)  # before any op
    loops, sides = _loops(args.towers, args.updates)
    for run in loops.values():
        run(), run()  # traces, warms up
    seconds, cpu = {name: [] for name in loops}, {name: [] for name in loops}
    load = os.getloadavg()[0]
    for _ in range(args.windows):
        for name, run in loops.items():
            start = time.process_time()
            seconds[name].append(run() / args.updates)
            cpu[name].append((time.process_time() - start) / args.updates)
    print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}; {args.towers} towers, median of {args.windows} "
          f"windows of {args.updates} updates of {128 // args.towers} examples")  # fmt: skip
    print(f"{'':28s} {'wall ms':>8s} {'CPU ms':>8s}  per update (CPU: both cores, robust to other load)")
    ms = {name: (statistics.median(seconds[name]) * 1000, statistics.median(cpu[name]) * 1000) for name in loops}
    for name, (wall, cpu_ms) in ms.items():
        print(f"{name:28s} {wall:8.3f} {cpu_ms:8.3f}")
    for name, (more, less) in (
        ("apply (in graph)", ("1 tower: compute + apply", "1 tower: compute only")),
        ("a call per update", ("1 tower: 1 update per call", "1 tower: compute + apply")),
    ):
        print(f"{name:28s} {ms[more][0] - ms[less][0]:8.3f} {ms[more][1] - ms[less][1]:8.3f}")
    for side in sides:
        side.close()
