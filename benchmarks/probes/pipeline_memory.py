"""`python -m benchmarks.probes pipeline_memory [--task=classify|lm] [--micro_batches=8,16]`: what each device
of a pipeline holds, at S = 1, 2, 4, counted from the built model and the traced graph (a CPU device reports no
allocator statistics, so nothing here is read from an allocator).

Per device, as `--device_memory_mb` counts it (`trainer/step/stepmemory.py`): the parameter state (the
variables and optimizer slots TensorFlow placed there, plus one gradient per variable) and the activations one
micro-batch keeps for its backward pass on that stage (read from the traced graph; the language model's padded
length counted as the context + 1), times the micro-batches the schedule keeps in flight on it (1f1b: S - s;
gpipe: all m of its pipeline). One device is the sum of the S = 4 stages (the same ops), holding one
micro-batch's activations at a time, or all K (the whole batch: nothing orders a tower's micro-batches, so
that is what data parallelism may hold). Prints the peak per device against both, and the bound 1/S of the
whole batch's peak plus the largest stage's excess over the mean (stages holding all K).
"""

from __future__ import annotations

import argparse
import sys


def measure(task: str, num_stages: int, micro_batches: int, schedule: str, remat: bool = False) -> dict:
    from trainer.loop.build import build
    from trainer.settings import config as cfg
    from trainer.step import stepmemory

    towers = cfg.TowerConfig(
        num_towers=num_stages,
        device="cpu",
        parameter_device="cpu",
        global_batch_size=4 * micro_batches,
        micro_batches=micro_batches,
        pipeline_stages=num_stages,
        pipeline_schedule=schedule,
        pipeline_remat=remat,
    )
    loop = cfg.LoopConfig(model_dir=f"/tmp/pipeline_memory_{task}", train_steps=10, export=False)
    model = cfg.ModelConfig(name="cnn")
    lm = cfg.TaskConfig(name=task, layers=4, heads=4, width=128, context=64)
    config = cfg.RunConfig(towers=towers, loop=loop, model=model, task=lm, optimizer=cfg.OptimizerConfig(name="adam"))
    trainer = build(config)
    per_device = stepmemory.needs(trainer.updater, trainer.optimizer, lm.context + 1)[:num_stages]  # pipeline 0
    trainer.updater.close()
    return {
        "state": [need.state for need in per_device],
        "saved": [need.kept for need in per_device],
        "in_flight": [need.in_flight for need in per_device],
        "recomputed": [need.recomputed for need in per_device],
        "total": [need.total for need in per_device],
    }


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
