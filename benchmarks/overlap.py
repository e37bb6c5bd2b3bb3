"""`python -m benchmarks.overlap`: when a 2-task sync step sends its partial gradient sums, drawn from a
profiler trace (benchmarks/overlap.png) and summed up in numbers.

    python -m benchmarks.overlap                       # resnet20 on 32x32x3 synthetic records, spread
    python -m benchmarks.overlap --model=cnn

Two `python -m trainer` tasks x 1 logical CPU device on 127.0.0.1, `--parameter_device=spread` (each task owns
about half of the variables), `--profile_steps` on the chief. The chief's trace (its XSpace host plane) has one
event per executed op, "node:OpType", with its start and duration. Its ops fall in four lanes: forward (and
the update), backward (under `gradient_tape/`), the `_Send`s of variable values to task 1 (the weights
phase) and the `_Send`s of gradients (the chief's partial sums of the variables task 1 owns: with one tower
per task each is one micro-batch's gradient, a subtree of one leaf). A `_Send` hands the tensor to the
rendezvous at once; task 1's RecvTensor RPC then pulls it, while the chief goes on. So a gradient `_Send`
that starts before the chief's last backward op is a transfer that overlaps the backward pass.

Printed per profiled step: backward span, gradient sends issued before its end, and how early the first
went. The trace shows the chief only: task 1's side of the same step is symmetric (it owns the other half).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import profile_summary
from benchmarks.multinode import COMMON, free_ports
from benchmarks.plan import SETTINGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LANES = ("forward and update", "backward", "_Send: variables", "_Send: gradients")
COLOURS = ((120, 160, 220), (230, 140, 60), (90, 170, 90), (200, 40, 40))
PROFILE = (20, 23)  # steps 21..23, one tf.function call each


def classify(node: str, op_type: str) -> int:
    """The lane of one op event of the chief."""
    if op_type == "_Send":
        return 3 if "gradient_tape" in node else 2
    return 1 if "gradient_tape" in node else 0


def load_ops(log_dir: str) -> tuple[list[tuple[float, float, int, str]], list[tuple[float, float]]]:
    """(start ms, duration ms, lane, node) of every op event of the newest trace under `log_dir`, and the
    (start, end) ms of every one-step function call on the Python thread (`_step`; a `_lean_steps` call runs
    several steps in a loop)."""
    space = profile_summary.newest_xspace(log_dir)
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    ops, steps = [], []
    for line in plane.lines:
        for event in line.events:
            name = plane.event_metadata[event.metadata_id].name
            start, length = line.timestamp_ns / 1e6 + event.offset_ps / 1e9, event.duration_ps / 1e9
            if line.name.startswith("tf_Compute") and ":" in name and "::" not in name:
                node, op_type = name.rsplit(":", 1)
                ops.append((start, length, classify(node, op_type), node))
            elif line.name == "__main__.py" and name.startswith("EagerLocalExecute: __inference__step_"):
                steps.append((start, start + length))
    return sorted(ops), sorted(steps)


def summarize(ops, step: tuple[float, float]) -> dict:
    """Backward span and the gradient sends of one step call (times in ms from the call's start)."""
    inside = [(s - step[0], d, lane, n) for s, d, lane, n in ops if step[0] <= s <= step[1]]
    backward = [(s, s + d) for s, d, lane, _ in inside if lane == 1]
    sends = [s for s, _, lane, _ in inside if lane == 3]
    if not backward or not sends:
        return {}
    first, last = min(b for b, _ in backward), max(e for _, e in backward)
    return {
        "step_ms": step[1] - step[0],
        "backward_ms": [first, last],
        "gradient_sends": len(sends),
        "sent_before_backward_ends": sum(s < last for s in sends),
        "first_send_before_end_ms": last - min(sends),
    }


def draw(ops, step: tuple[float, float], path: str, title: str) -> None:
    """One step of the chief as four lanes of op boxes, to a PNG."""
    from PIL import Image, ImageDraw  # noqa: PLC0415 (Pillow: a dependency of tensorboard)

    width, left, lane_h, top = 1400, 190, 46, 50
    span = step[1] - step[0]
    image = Image.new("RGB", (width, top + lane_h * len(LANES) + 60), "white")
    pen = ImageDraw.Draw(image)
    pen.text((10, 12), title, fill="black")
    x = lambda ms: left + (ms - step[0]) / span * (width - left - 20)  # noqa: E731
    for lane, (name, colour) in enumerate(zip(LANES, COLOURS, strict=True)):
        y = top + lane * lane_h
        pen.text((10, y + 16), name, fill="black")
        pen.line([(left, y + lane_h - 4), (width - 20, y + lane_h - 4)], fill=(220, 220, 220))
        for start, length, which, _ in ops:
            if which == lane and step[0] <= start <= step[1]:
                x0 = x(start)
                pen.rectangle([x0, y + 6, max(x(start + length), x0 + 1), y + lane_h - 8], fill=colour)
    bottom = top + lane_h * len(LANES) + 10
    for tick in range(0, int(span) + 1, max(1, int(span) // 10)):
        pen.line([(x(step[0] + tick), bottom), (x(step[0] + tick), bottom + 6)], fill="black")
        pen.text((x(step[0] + tick) - 8, bottom + 10), f"{tick} ms", fill="black")
    image.save(path)


def run(model_dir: str, flags: list[str]) -> None:
    """The 2-task run; the chief records the trace."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    for task in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": task}}
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(tf_config))
        command = [sys.executable, "-m", "trainer", f"--model_dir={model_dir}", "--num_gpus=1", *flags]
        procs.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL))
    if (codes := [p.wait() for p in procs]) != [0, 0]:
        raise RuntimeError(f"the 2-task run failed with {codes}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overlap", description=__doc__.split("\n")[0])
    parser.add_argument("--setting", default="resnet20-synth", choices=sorted(SETTINGS))
    parser.add_argument("--png", default=os.path.join(ROOT, "benchmarks", "overlap.png"))
    args = parser.parse_args()
    from benchmarks.records import ensure_records  # noqa: PLC0415 (imports TensorFlow)

    setting = SETTINGS[args.setting]
    records = ensure_records(setting)
    flags = [
        *(f for f in COMMON if not f.startswith("--parameter_device")),
        "--parameter_device=spread",
        f"--model={setting.model}",
        f"--train_data={records['train']}",
        f"--eval_data={records['eval']}",
        f"--num_classes={setting.num_classes}",
        f"--global_batch_size={setting.global_batch_size}",
        f"--train_steps={PROFILE[1] + 2}",
        f"--profile_steps={PROFILE[0]},{PROFILE[1]}",
    ]
    with tempfile.TemporaryDirectory() as root:
        run(f"{root}/run", flags)
        ops, steps = load_ops(f"{root}/run/train")
    steps = [s for s in steps if summarize(ops, s)]
    rows = [summarize(ops, s) for s in steps]
    for number, row in enumerate(rows, PROFILE[0] + 1):
        print(f"step {number}: {json.dumps(row)}")
    middle = steps[len(steps) // 2]
    title = (
        f"chief (task 0 of 2, 1 tower each), {setting.name}, --parameter_device=spread: one step, "
        f"{middle[1] - middle[0]:.1f} ms; gradient sends before the backward pass ends: "
        f"{statistics.median(r['sent_before_backward_ends'] for r in rows)} of {rows[0]['gradient_sends']} (median)"
    )
    draw(ops, middle, args.png, title)
    print(f"timeline of step {PROFILE[0] + 1 + len(steps) // 2}: {args.png}")


if __name__ == "__main__":
    main()
