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
class SlurmJob:
    """The Slurm job this process runs in, as its environment says."""

    job_id: str
    array_job_id: str = ""
    array_task_id: str = ""
    restart_count: int = 0  # SLURM_RESTART_COUNT: how often the job was requeued (time limit or preemption)
    node: str = ""

    @property
    def requeue_target(self) -> str:
        """What `scontrol requeue` takes: `ARRAYJOB_TASK` for an array task, else the job id."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    def describe(self) -> str:
        array = f" (array task {self.requeue_target})" if self.array_task_id else ""
        return f"slurm job {self.job_id}{array}, restart {self.restart_count}, node {self.node or '?'}"


def slurm_job(environ: Mapping[str, str]) -> SlurmJob | None:
    """The Slurm job of this process, or None outside Slurm."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id:
        return None
    return SlurmJob(
        job_id=job_id,
        array_job_id=environ.get("SLURM_ARRAY_JOB_ID", ""),
        array_task_id=environ.get("SLURM_ARRAY_TASK_ID", ""),
        restart_count=int(environ.get("SLURM_RESTART_COUNT") or 0),
        node=environ.get("SLURMD_NODENAME", ""),
    )


@dataclasses.dataclass(frozen=True)
class TaskLayout:
    num_tasks: int
    task_index: int
    source: str  # which variables said so: "slurm", "tf_config" or "none"


def task_layout(environ: Mapping[str, str]) -> TaskLayout:
    """Reads the number of processes running this program and this one's index, from Slurm's step variables
    or TF_CONFIG.

    Under Slurm what counts is the job *step* this process belongs to: an `srun` step runs
    SLURM_STEP_NUM_TASKS tasks; the batch script itself (no `srun`) is one process, whatever the
    allocation's SLURM_NTASKS says (`#SBATCH --ntasks=2` with a plain `python -m trainer` runs one trainer).

    Raises:
      ValueError: TF_CONFIG is set but is not valid JSON.
    """
    if "SLURM_STEP_NUM_TASKS" in environ:
        return TaskLayout(int(environ["SLURM_STEP_NUM_TASKS"]), int(environ.get("SLURM_PROCID", 0)), "slurm")
    if "SLURM_JOB_ID" in environ or "SLURM_NTASKS" in environ:
        return TaskLayout(1, 0, "slurm")  # the batch step: one process
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
            "one task per job step (`exec python -m trainer` in the batch script, or `srun --ntasks=1`): "
            "one task drives every GPU of the node"
            if layout.source == "slurm"
            else "one task in TF_CONFIG's cluster"
        )
        raise ValueError(
            f"this job step starts {layout.num_tasks} tasks ({layout.source}), but towerflow trains on the towers of "
            f"one machine from one process; more tasks would be independent runs writing one --model_dir. "
            f"Use {how} and --num_gpus for the GPUs."
        )
