"""`python -m trainer.outputs.lost --model_dir=DIR --max_requeues=N`: the end of a multi-task Slurm job.

The batch script `launch.slurm` renders runs this after its srun step ends, on the job's first node (the
chief's, which holds `DIR/attempts.json`). When the last attempt ended because a task was lost, it requeues the
job so that the run comes back by itself, as after a time limit (`trainer.outputs.attempts.after_lost_task`).
It reads a JSON file and may call `scontrol requeue`; TensorFlow is imported (by the outputs package) but
not used, its log lines silenced.
"""

from __future__ import annotations

import argparse
import os
import sys

from launch.cluster import slurm_job
from trainer.system import console


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.outputs.lost", description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--max_requeues", type=int, default=3)
    args = parser.parse_args(argv)
    with console.native_stderr_filtered(console.prepare_tensorflow("cpu", None)):
        from trainer.outputs import attempts as attempts_lib  # noqa: PLC0415 (imports TensorFlow: its lines held)

    job = slurm_job(os.environ)
    if job is None:
        print("towerflow: not a Slurm job: nothing to requeue", file=sys.stderr)
        return 0
    line = attempts_lib.after_lost_task(attempts_lib.AttemptLog(args.model_dir), job, args.max_requeues)
    print(f"=== towerflow: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
