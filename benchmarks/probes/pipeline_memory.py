"""`python -m benchmarks.probes pipeline_memory [--task=classify|lm] [--micro_batches=8,16]`: what each device
of a pipeline holds, at S = 1, 2, 4, counted from the built model and the traced graph (a CPU device reports no
allocator statistics, so nothing here is read from an allocator).

Per device: the parameter state (each variable on it, its gradient and its optimizer slots: the bytes of the
variables and slots TensorFlow placed there, plus one gradient per variable) and the activations one
micro-batch keeps for its backward pass on that stage (every tensor a forward event's ops produce that an op of
the same micro-batch's backward event reads, on that device; an unknown dimension, the language model's padded
length, counted as the context + 1), times the micro-batches the schedule keeps in flight on it (1f1b: S - s;
gpipe: all m of its pipeline). One device is the sum of the S = 4 stages (the same ops), holding one
micro-batch's activations at a time, or all K (the whole batch: nothing orders a tower's micro-batches, so
that is what data parallelism may hold). Prints the peak per device against both, and the bound 1/S of the
whole batch's peak plus the largest stage's excess over the mean (stages holding all K).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def _bytes(tensor, unknown: int) -> int:
    dims = [unknown if d is None else d for d in tensor.shape.as_list()] if tensor.shape.rank is not None else [0]
    return int(np.prod(dims, dtype=np.int64)) * tensor.dtype.size


def saved_per_stage(graph, num_stages: int, unknown: int) -> list[int]:
    """Bytes pipeline 0's micro-batch 0 keeps per stage for its backward pass, read from `graph`: the outputs of
    its forward event's ops that its backward's ops read (the tape names a gradient op after the forward op it
    differentiates, under "gradient_tape/", whatever scope it was made in)."""
    saved = []
    for stage in range(num_stages):
        forward = f"pipeline0_stage{stage}_F0/"
        backward = (f"gradient_tape/{forward}", f"pipeline0_stage{stage}_B0/")
        kept = {
            tensor.name
            for op in graph.get_operations()
            if op.name.startswith(backward)
            for tensor in op.inputs
            if tensor.op.name.startswith(forward)
        }
        saved.append(sum(_bytes(graph.get_tensor_by_name(name), unknown) for name in kept))
    return saved


def state_per_device(trainer, devices: list[str]) -> list[int]:
    """Variables and optimizer slots placed on each device, plus a gradient per trainable variable."""
    import tensorflow as tf

    from trainer.step import spread

    def on(variables, device) -> int:
        spec = spread.full_name(device)
        here = [v for v in variables if tf.DeviceSpec.from_string(spread.device_of(v)) == spec and len(v.shape)]
        return sum(spread.variable_bytes(v) for v in here)

    model, slots = trainer.model, trainer.optimizer.variables  # gradients: one per trainable variable
    return [on(model.variables, d) + on(model.trainable_variables, d) + on(slots, d) for d in devices]


def measure(task: str, num_stages: int, micro_batches: int, schedule: str) -> dict:
    from trainer.loop.build import build
    from trainer.settings import config as cfg
    from trainer.step import schedules

    towers = cfg.TowerConfig(
        num_towers=num_stages,
        device="cpu",
        parameter_device="cpu",
        global_batch_size=4 * micro_batches,
        micro_batches=micro_batches,
        pipeline_stages=num_stages,
        pipeline_schedule=schedule,
    )
    loop = cfg.LoopConfig(model_dir=f"/tmp/pipeline_memory_{task}", train_steps=10, export=False)
    model = cfg.ModelConfig(name="cnn")
    lm = cfg.TaskConfig(name=task, layers=4, heads=4, width=128, context=64)
    config = cfg.RunConfig(towers=towers, loop=loop, model=model, task=lm, optimizer=cfg.OptimizerConfig(name="adam"))
    trainer = build(config)
    runner = trainer.updater.runner
    saved = saved_per_stage(trainer.updater.step_graph(), num_stages, lm.context + 1)
    per_stage = schedules.SCHEDULES[schedule](num_stages, micro_batches)
    flights = [schedules.in_flight(events) for events in per_stage]
    state = state_per_device(trainer, [runner.device(0, s) for s in range(num_stages)])
    trainer.updater.close()
    return {"state": state, "saved": saved, "in_flight": flights}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes pipeline_memory")
    parser.add_argument("--task", default="classify", choices=("classify", "lm"))
    parser.add_argument("--micro_batches", default="8,16")
    args = parser.parse_args(argv)
    from trainer.system import devices

    devices.configure_logical_cpus(4)
    for k in [int(x) for x in args.micro_batches.split(",")]:
        finest = measure(args.task, 4, k, "1f1b")
        state, saved = sum(finest["state"]), sum(finest["saved"])
        one_at_a_time, whole_batch = state + saved, state + k * saved  # one device: 1 or all K micro-batches alive
        print(
            f"{args.task} K={k}: one device {one_at_a_time / 2**20:.2f} MiB with one micro-batch alive, "
            f"{whole_batch / 2**20:.2f} MiB with all K (state {state / 2**20:.2f}, activations {saved / 2**20:.2f})"
        )
        for num_stages in (2, 4):
            for schedule in ("1f1b", "gpipe"):
                m = finest if (num_stages, schedule) == (4, "1f1b") else measure(args.task, num_stages, k, schedule)
                peaks = [st + fl * sv for st, fl, sv in zip(m["state"], m["in_flight"], m["saved"], strict=True)]
                sizes = [st + k * sv for st, sv in zip(m["state"], m["saved"], strict=True)]  # all K alive
                bound = 1 / num_stages + (max(sizes) - sum(sizes) / num_stages) / whole_batch
                print(
                    f"  S={num_stages} {schedule:5s} peak per device MiB {[round(p / 2**20, 2) for p in peaks]}; "
                    f"max {max(peaks) / one_at_a_time:.3f} of one micro-batch alive, {max(peaks) / whole_batch:.3f} "
                    f"of all K; 1/S + largest stage's excess {bound:.3f}; in flight {m['in_flight']}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
