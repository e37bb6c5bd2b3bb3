"""`python -m benchmarks.probes lm_memory --train_data=GLOB [--preset=gpt2-small] [--micro_batch=8]
[--micro_batches=4]`: what each device needs for the language model's step at the layouts a user would pick,
as `--device_memory_mb` counts it (`trainer/step/memory/device_memory.py`): data parallel on 1, 2 and 4
devices (the one copy of the variables on the first tower, `--parameter_device=gpu`, and spread over the
towers), 2 and 4 pipeline stages (1f1b, without and with `--pipeline_remat`), each in float32 and bf16.

Nothing runs a step: each layout builds the trainer (the model, its optimizer slots, the traced step) and
counts. The records give the vocabulary; every layout has K micro-batches of `--micro_batch` sequences of the
context's length (the padded length counted at context + 1). Prints one line per layout and device: MiB of
state (variables, slots, gradients), micro-batches in flight x MiB each keeps, MiB recomputed, the total.
"""

from __future__ import annotations

import argparse
import sys
import time

LAYOUTS = (  # (name, towers, stages, parameter_device, remat)
    ("data parallel", 1, 1, "gpu", False),
    ("data parallel", 2, 1, "gpu", False),
    ("data parallel, spread", 2, 1, "spread", False),
    ("data parallel", 4, 1, "gpu", False),
    ("data parallel, spread", 4, 1, "spread", False),
    ("2 stages 1f1b", 2, 2, "gpu", False),
    ("2 stages 1f1b remat", 2, 2, "gpu", True),
    ("4 stages 1f1b", 4, 4, "gpu", False),
    ("4 stages 1f1b remat", 4, 4, "gpu", True),
)


def measure(args, towers: int, stages: int, placement: str, remat: bool, precision: str) -> list:
    """The `device_memory.DeviceNeed` of each device of one layout."""
    from trainer.loop.build import build
    from trainer.settings import config as cfg
    from trainer.step.memory import device_memory

    tower_config = cfg.TowerConfig(
        num_towers=towers,
        device="cpu",
        parameter_device=placement,
        global_batch_size=args.micro_batch * args.micro_batches,
        micro_batches=args.micro_batches,
        pipeline_stages=stages,
        pipeline_remat=remat,
        mixed_precision="" if precision == "fp32" else precision,
    )
    config = cfg.RunConfig(
        towers=tower_config,
        loop=cfg.LoopConfig(model_dir=f"/tmp/lm_memory_{towers}_{stages}_{remat}", train_steps=10, export=False),
        data=cfg.DataConfig(train_data=args.train_data, eval_data=args.train_data),  # eval: not read here
        task=cfg.TaskConfig(name="lm", options={"preset": args.preset}),
        optimizer=cfg.OptimizerConfig(name="adamw"),
    )
    trainer = build(config)
    context = trainer.task.context
    found = device_memory.needs(trainer.updater, trainer.optimizer, context + 1)
    trainer.updater.close()
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes lm_memory")
    parser.add_argument("--train_data", required=True, help="text records (python -m data.prepare text)")
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--micro_batch", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--micro_batches", type=int, default=4, help="K")
    parser.add_argument("--precision", default="fp32,bf16", help="fp32,bf16 (--mixed_precision)")
    args = parser.parse_args(argv)
    from trainer.step.memory.device_memory import MIB
    from trainer.system import devices

    devices.configure_logical_cpus(4)
    for precision in args.precision.split(","):
        for name, towers, stages, placement, remat in LAYOUTS:
            start = time.perf_counter()
            found = measure(args, towers, stages, placement, remat, precision)
            print(f"{precision} {name} N={towers} ({time.perf_counter() - start:.0f} s to build and count)")
            for need in found:
                recomputed = f" + {need.recomputed / MIB:.0f} recomputed" if need.recomputed else ""
                print(
                    f"  {need.device}: state {need.state / MIB:.0f} + {need.in_flight} x {need.kept / MIB:.0f} kept"
                    f"{recomputed} = {need.total / MIB:.0f} MiB"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
