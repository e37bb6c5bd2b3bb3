"""`python -m benchmarks.probes pipeline_memory [--task=classify|lm] [--micro_batches=8,16]`: what each device
of a pipeline holds, at S = 1, 2, 4, counted from the built model and the traced graph (a CPU device reports no
allocator statistics, so nothing here is read from an allocator).

Per device, as `--device_memory_mb` counts it (`trainer/step/memory/device_memory.py`): the parameter state (the
variables and optimizer slots TensorFlow placed there, plus one gradient per variable) and the activations one
micro-batch keeps for its backward pass on that stage (read from the traced graph; the language model's padded
length counted as the context + 1), times the micro-batches the schedule keeps in flight on it (1f1b: S - s;
gpipe: all m of its pipeline). One device is the sum of the S = 4 stages (the same ops), holding one
micro-batch's activations at a time, or all K (the whole batch: nothing orders a tower's micro-batches, so
that is what data parallelism may hold). Prints the peak per device against both, and the bound 1/S of the
whole batch's peak plus the largest stage's excess over the mean (stages holding all K). Each layout is
measured without and with `--pipeline_remat` (a recomputing stage holds its inputs per micro-batch in flight
and one micro-batch's activations, recomputed in its backward).

`--step_time`: instead, what remat costs: the step time of S = 4 1f1b at the first K, with and without remat,
one run of each built side by side, median over rounds of 5 steps taken in turn (wall time: the logical
devices share the machine's cores, so the recomputed forwards add their CPU time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

CONTEXT = 64  # the language model's; a padded length is counted at CONTEXT + 1


def measure(task: str, num_stages: int, micro_batches: int, schedule: str, remat: bool = False) -> dict:
    from trainer.step.memory import device_memory

    trainer = _build(task, num_stages, micro_batches, schedule, remat)
    per_device = device_memory.needs(trainer.updater, trainer.optimizer, CONTEXT + 1)[:num_stages]  # pipeline 0
    trainer.updater.close()
    return {
        "state": [need.state for need in per_device],
        "saved": [need.kept for need in per_device],
        "in_flight": [need.in_flight for need in per_device],
        "recomputed": [need.recomputed for need in per_device],
        "total": [need.total for need in per_device],
    }


def step_times(task: str, micro_batches: int, rounds: int = 10) -> dict:
    """{remat: [seconds per step of each round of 5 steps]} at S = 4, 1f1b (the first round includes the
    retrace for 5 steps per call: take the median)."""
    trainers = {remat: _build(task, 4, micro_batches, "1f1b", remat) for remat in (False, True)}
    for trainer in trainers.values():
        float(trainer.updater.train_steps(3).loss)
    times = {False: [], True: []}
    for _ in range(rounds):
        for remat, trainer in trainers.items():
            start = time.perf_counter()
            float(trainer.updater.train_steps(5).loss)
            times[remat].append((time.perf_counter() - start) / 5)
    for trainer in trainers.values():
        trainer.updater.close()
    return times


def _build(task: str, num_stages: int, micro_batches: int, schedule: str, remat: bool, num_towers: int = 0):
    from trainer.loop.build import build
    from trainer.settings import config as cfg

    towers = cfg.TowerConfig(
        num_towers=num_towers or num_stages,
        device="cpu",
        parameter_device="cpu",
        global_batch_size=4 * micro_batches,
        micro_batches=micro_batches,
        pipeline_stages=num_stages,
        pipeline_schedule=schedule,
        pipeline_remat=remat,
    )
    loop = cfg.LoopConfig(model_dir=f"/tmp/pipeline_memory_{task}_{remat}", train_steps=1000, export=False)
    model = cfg.ModelConfig(name="cnn")
    sizes = {"layers": 4, "heads": 4, "width": 128, "context": CONTEXT} if task == "lm" else {}  # lm's arguments
    lm = cfg.TaskConfig(name=task, options=sizes)
    config = cfg.RunConfig(towers=towers, loop=loop, model=model, task=lm, optimizer=cfg.OptimizerConfig(name="adam"))
    return build(config)


def paper(task: str, per_pipeline: int) -> None:
    """The paper model's layout: 8 devices as 2 pipelines of 4 stages, `per_pipeline` micro-batches each: what
    every device needs (pipeline 1's devices hold no variables: they read pipeline 0's), with and without remat."""
    from trainer.step.memory import device_memory

    for schedule in ("1f1b", "gpipe"):
        for remat in (False, True):
            trainer = _build(task, 4, 2 * per_pipeline, schedule, remat, num_towers=8)
            needs = device_memory.needs(trainer.updater, trainer.optimizer, CONTEXT + 1)
            trainer.updater.close()
            print(
                f"{task} 2 pipelines x 4 stages, K={2 * per_pipeline} ({per_pipeline} per pipeline), {schedule:5s} "
                f"remat={'on ' if remat else 'off'}: MiB per device {[round(n.total / 2**20, 2) for n in needs]}"
            )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes pipeline_memory")
    parser.add_argument("--task", default="classify", choices=("classify", "lm"))
    parser.add_argument("--micro_batches", default="8,16")
    parser.add_argument("--step_time", action="store_true")
    parser.add_argument("--paper", action="store_true", help="8 devices: 2 pipelines x 4 stages, 32 micro-batches each")
    args = parser.parse_args(argv)
    from trainer.system import devices

    devices.configure_logical_cpus(8 if args.paper else 4)
    if args.paper:
        paper(args.task, 32)
        return 0
    if args.step_time:
        k = int(args.micro_batches.split(",")[0])
        times = step_times(args.task, k)
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"{args.task} S=4 1f1b K={k}: step {off:.4f} s, with remat {on:.4f} s: ratio {on / off:.3f}")
        print(f"  rounds without {[round(t, 4) for t in times[False]]}, with {[round(t, 4) for t in times[True]]}")
        return 0
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
                for remat in (False, True):
                    same = (num_stages, schedule, remat) == (4, "1f1b", False)
                    m = finest if same else measure(args.task, num_stages, k, schedule, remat)
                    sizes = [st + k * sv for st, sv in zip(m["state"], m["saved"], strict=True)]  # all K alive
                    bound = 1 / num_stages + (max(sizes) - sum(sizes) / num_stages) / whole_batch
                    mib = lambda values: [round(v / 2**20, 2) for v in values]  # noqa: E731
                    what = (
                        f"kept per micro-batch {mib(m['saved'])}, recomputed {mib(m['recomputed'])}"
                        if remat
                        else f"1/S + largest stage's excess {bound:.3f}"
                    )
                    print(
                        f"  S={num_stages} {schedule:5s} remat={'on ' if remat else 'off'} peak per device MiB "
                        f"{mib(m['total'])}; max {max(m['total']) / one_at_a_time:.3f} of one micro-batch alive, "
                        f"{max(m['total']) / whole_batch:.3f} of all K; {what}; in flight {m['in_flight']}"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
