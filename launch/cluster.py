"""The task layout of a job, read from Slurm's or TensorFlow's environment variables.

towerflow trains on the towers of one machine, driven by one process. Until multi-node training lands, a
job that starts several tasks would run several independent trainings writing the same --model_dir, so
`require_single_task` refuses it with a message that says what to change.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class TaskLayout:
    num_tasks: int
    task_index: int
    source: str  # which variables said so: "slurm", "tf_config" or "none"


def task_layout(environ: Mapping[str, str]) -> TaskLayout:
    """Reads the number of tasks and this task's index from SLURM_NTASKS/SLURM_PROCID or TF_CONFIG.

    Raises:
      ValueError: TF_CONFIG is set but is not valid JSON.
    """
    if "SLURM_NTASKS" in environ or "SLURM_NPROCS" in environ:
        count = int(environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or 1)
        return TaskLayout(count, int(environ.get("SLURM_PROCID", 0)), "slurm")
    if environ.get("TF_CONFIG"):
        try:
            tf_config = json.loads(environ["TF_CONFIG"])
        except json.JSONDecodeError as e:
            raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from e
        count = sum(len(tasks) for tasks in tf_config.get("cluster", {}).values())
        return TaskLayout(max(count, 1), int(tf_config.get("task", {}).get("index", 0)), "tf_config")
    return TaskLayout(1, 0, "none")


def require_single_task(environ: Mapping[str, str]) -> None:
    """Raises ValueError when the job runs more than one task of towerflow."""
    layout = task_layout(environ)
    if layout.num_tasks > 1:
        how = (
            "#SBATCH --ntasks=1 (one task drives every GPU of the node)"
            if layout.source == "slurm"
            else "one task in TF_CONFIG's cluster"
        )
        raise ValueError(
            f"this job starts {layout.num_tasks} tasks ({layout.source}), but towerflow trains on the towers of "
            f"one machine from one process; more tasks would be independent runs writing one --model_dir. "
            f"Use {how} and --num_gpus for the GPUs."
        )
