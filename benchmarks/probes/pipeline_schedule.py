"""`python -m benchmarks.probes pipeline_schedule [--stages=4] [--micro_batches=16] [--forward_ms=10]
[--backward_ms=20] [--steps=4] [--svg=PATH]`: does a pipeline run its schedule, at the speed the schedule
allows?

A synthetic model of S stages of equal, fixed cost: each stage a small Dense whose output passes through a
host callback that sleeps `forward_ms` (and `backward_ms` on its gradient). Sleeping costs no CPU, so the S
logical devices run their events at once even on a 2-core machine, which is what S GPUs do; the Dense layers'
own arithmetic (on 4-row micro-batches) is small beside the sleeps. With t = forward + backward per micro-batch
and stage, both schedules should take (K + S - 1) * t per step (one pipeline, K micro-batches) and report a
bubble of (S - 1) / (K + S - 1). Prints, per schedule, the step time against that, the bubble each run reports
against the formula, and the micro-batches in flight per stage read from the timestamps; `--svg` draws one
timed step of each schedule (a lane per stage, forward light, backward dark).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import keras
import numpy as np
import tensorflow as tf

SLEEP = {"forward": 0.010, "backward": 0.020}  # seconds; set from the command line before the model is built


def _sleeping(seconds_key: str):
    def call(x):
        time.sleep(SLEEP[seconds_key])
        return x

    return call


@keras.saving.register_keras_serializable(package="towerflow_probe")
class Busy(keras.layers.Layer):
    """Dense(units), then a pass-through that sleeps SLEEP['forward'] (SLEEP['backward'] on the gradient)."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return _busy(self.dense(x))


@tf.custom_gradient
def _busy(y):
    out = tf.numpy_function(_sleeping("forward"), [y], y.dtype, stateful=False)
    out.set_shape(y.shape)

    def grad(dy):
        back = tf.numpy_function(_sleeping("backward"), [dy], dy.dtype, stateful=False)
        back.set_shape(dy.shape)
        return back

    return out, grad


def busy_model(input_shape, num_classes, num_stages: int = 4):
    """Flatten, then `num_stages` Busy layers of equal parameter bytes (the last one also gives the logits)."""
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    width = int(np.prod(input_shape))
    for i in range(num_stages - 1):
        x = Busy(width, name=f"busy{i}")(x)
    x = Busy(width, name=f"busy{num_stages - 1}")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="busy")


def run(schedule: str, args) -> dict:
    """Steps of the busy model through one pipeline of `args.stages`; the median step time and the timed
    step's events."""
    from trainer.loop.build import build
    from trainer.settings import config as cfg

    towers = cfg.TowerConfig(
        num_towers=args.stages,
        device="cpu",
        parameter_device="cpu",
        global_batch_size=4 * args.micro_batches,
        micro_batches=args.micro_batches,
        pipeline_stages=args.stages,
        pipeline_schedule=schedule,
    )
    loop = cfg.LoopConfig(model_dir=f"/tmp/pipeline_schedule_{schedule}", train_steps=100, export=False)
    runtime = cfg.RuntimeConfig(inter_op_threads=4 * args.stages)
    config = cfg.RunConfig(
        towers=towers,
        loop=loop,
        runtime=runtime,
        model=cfg.ModelConfig(name=f"{__name__}:_model_{args.stages}"),
        deterministic=True,
    )
    trainer = build(config)
    updater = trainer.updater
    updater.train_steps(2)  # traces the step's graph (the in-graph loop every window runs)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        updater.train_steps(1)
        times.append(time.perf_counter() - start)
    result = updater.train_steps(1)
    timings = updater.last_timings
    runner = updater.runner
    return {
        "step_sec": statistics.median(times),
        "bubble": runner.run_metrics(timings)["pipeline"]["bubble_measured"],
        "events": list(zip(runner.event_names, timings["event_sec"], strict=True)),
        "loss": result.loss,
    }


def _model_factory(num_stages: int):
    return lambda input_shape, num_classes: busy_model(input_shape, num_classes, num_stages)


_model_2, _model_4, _model_8 = (_model_factory(s) for s in (2, 4, 8))


def in_flight_from_times(events: list, stage: int) -> int:
    """The most micro-batches `stage` held between their forward and backward, its events ordered by the
    times they started."""
    from trainer.step.pipeline import schedules

    mine = sorted((start, name.split(":")[1]) for name, (start, _) in events if int(name.split(":")[0]) == stage)
    return schedules.in_flight([(event[0], int(event[1:])) for _, event in mine])


def svg(runs: dict, num_stages: int) -> str:
    """One timed step of each schedule: a lane per stage, a box per event (forward light, backward dark)."""
    scale, lane, out, y = 900.0, 22, [], 10
    longest = max(max(e for _, (_, e) in r["events"]) - min(s for _, (s, _) in r["events"]) for r in runs.values())
    for schedule, result in runs.items():
        origin = min(s for _, (s, _) in result["events"])
        out.append(f'<text x="10" y="{y + 12}" font-size="13">{schedule}</text>')
        y += 18
        for name, (start, end) in result["events"]:
            stage, event = name.split(":")
            x, width = 80 + scale * (start - origin) / longest, max(1.0, scale * (end - start) / longest)
            color = "#9ecae1" if event[0] == "F" else "#3182bd"
            top = y + int(stage) * lane
            out.append(f'<rect x="{x:.1f}" y="{top}" width="{width:.1f}" height="{lane - 4}" fill="{color}"/>')
            out.append(f'<text x="{x + 2:.1f}" y="{top + 13}" font-size="9">{event}</text>')
        for stage in range(num_stages):
            out.append(f'<text x="10" y="{y + stage * lane + 13}" font-size="11">stage {stage}</text>')
        y += num_stages * lane + 16
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="1000" height="{y}">' + "".join(out) + "</svg>"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes pipeline_schedule")
    parser.add_argument("--stages", type=int, default=4, choices=(2, 4, 8))
    parser.add_argument("--micro_batches", type=int, default=16)
    parser.add_argument("--forward_ms", type=float, default=10.0)
    parser.add_argument("--backward_ms", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--svg", default="")
    args = parser.parse_args(argv)
    SLEEP.update(forward=args.forward_ms / 1000, backward=args.backward_ms / 1000)
    from trainer.system import devices

    devices.configure_logical_cpus(args.stages)
    s, k = args.stages, args.micro_batches
    ideal = (k + s - 1) * (args.forward_ms + args.backward_ms) / 1000
    expected_bubble = (s - 1) / (k + s - 1)
    runs = {schedule: run(schedule, args) for schedule in ("gpipe", "1f1b")}
    print(f"S={s} K={k} t={args.forward_ms + args.backward_ms:g} ms: ideal step (K+S-1)*t = {ideal * 1000:.0f} ms, "
          f"bubble (S-1)/(K+S-1) = {expected_bubble:.3f}")  # fmt: skip
    for schedule, result in runs.items():
        flight = [in_flight_from_times(result["events"], stage) for stage in range(s)]
        print(
            f"{schedule:6s} step {result['step_sec'] * 1000:.0f} ms = {result['step_sec'] / ideal:.3f} x ideal; "
            f"bubble {result['bubble']:.3f} = {result['bubble'] / expected_bubble:.3f} x formula; "
            f"in flight per stage {flight}"
        )
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(runs, s))
        print(f"timeline: {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
