"""`python -m benchmarks.probes profile_summary A_DIR B_DIR --steps N`: where two sides' step time differs, by op type.

Reads the TensorFlow profiler traces `--profile DIR` leaves (DIR/<figure>-<setting>/{a,b}), without
TensorBoard's profile plugin: the host plane of the XSpace proto holds one event per executed op (named
"node:OpType"), per Python call on the main thread, and per executor batch ("ExecutorState::Process").
Per step: how many ops ran and how long each op type took, side by side, largest difference first; and the
Python-thread events that say where host time went (function calls, eager ops between steps).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os

_SKIP = ("ThreadpoolListener",)  # bookkeeping events around every threadpool task


def newest_xspace(log_dir: str):
    """The newest profiler trace under `log_dir` (TensorBoard's plugins/profile/*/*.xplane.pb), parsed."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415 (imports TensorFlow)

    paths = sorted(glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb")))
    if not paths:
        raise FileNotFoundError(f"no *.xplane.pb under {log_dir}/plugins/profile/")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    return space


def load_host_events(log_dir: str) -> list[tuple[str, str, float]]:
    """(thread kind, event name, milliseconds) of every host event of the newest trace under `log_dir`."""
    space = newest_xspace(log_dir)
    events = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            kind = line.name.split("/")[0]  # "python", "tf_Compute", "tf_data_...", "tf_numa_..._Eigen"
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if not name.startswith(_SKIP):
                    events.append((kind, name, event.duration_ps / 1e9))
    return events


def by_op_type(events) -> tuple[collections.Counter, collections.Counter]:
    """Milliseconds and counts per op type, from the executor's "node:OpType" events."""
    millis, counts = collections.Counter(), collections.Counter()
    for kind, name, ms in events:
        if kind == "tf_Compute" and ":" in name and "::" not in name:  # not "ExecutorState::Process"
            op_type = name.rsplit(":", 1)[1]
            millis[op_type] += ms
            counts[op_type] += 1
    return millis, counts


def python_events(events) -> collections.Counter:
    millis = collections.Counter()
    for kind, name, ms in events:
        if kind == "python":
            millis[name] += ms
    return millis


def report(dir_a: str, dir_b: str, steps: int, top: int) -> list[str]:
    events_a, events_b = load_host_events(dir_a), load_host_events(dir_b)
    (ms_a, n_a), (ms_b, n_b) = by_op_type(events_a), by_op_type(events_b)
    lines = [
        f"per step ({steps} steps): A {sum(n_a.values()) / steps:.0f} ops, B {sum(n_b.values()) / steps:.0f} ops",
        f"{'op type':36s} {'A ms/step':>10s} {'n':>4s} {'B ms/step':>10s} {'n':>4s} {'A-B':>8s}",
    ]
    diffs = sorted(set(ms_a) | set(ms_b), key=lambda t: -abs(ms_a[t] - ms_b[t]))
    for op_type in diffs[:top]:
        a, b = ms_a[op_type] / steps, ms_b[op_type] / steps
        count_a, count_b = n_a[op_type] // steps, n_b[op_type] // steps
        lines.append(f"{op_type[:36]:36s} {a:10.3f} {count_a:4d} {b:10.3f} {count_b:4d} {a - b:+8.3f}")
    for label, events in (("A", events_a), ("B", events_b)):
        lines.append(f"python thread, {label} (ms per step):")
        lines += [f"  {ms / steps:9.3f}  {name[:90]}" for name, ms in python_events(events).most_common(8)]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.probes profile_summary", description=__doc__.split("\n")[0]
    )
    parser.add_argument("dir_a", help="trace directory of side A (e.g. DIR/tower1_vs_plain-cnn-digits/a)")
    parser.add_argument("dir_b", help="trace directory of side B")
    parser.add_argument("--steps", type=int, required=True, help="steps in the traced window (the table's NxSTEPS)")
    parser.add_argument("--top", type=int, default=25, help="op types to list")
    args = parser.parse_args(argv)
    print("\n".join(report(args.dir_a, args.dir_b, args.steps, args.top)))
    return 0
