"""launch.cluster: the task layout from Slurm/TF_CONFIG variables, and the single-task guard."""

import json

import pytest

from launch.cluster import TaskLayout, require_single_task, task_layout


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, TaskLayout(1, 0, "none")),
        # an srun step of 4 tasks
        (
            {"SLURM_JOB_ID": "9", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"},
            TaskLayout(4, 3, "slurm"),
        ),
        # the batch script of an allocation of 2 tasks runs one process
        ({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, TaskLayout(1, 0, "slurm")),
        # an `srun --ntasks=1` step inside that allocation
        ({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "1"}, TaskLayout(1, 0, "slurm")),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": ["a:1", "b:2"], "chief": ["c:3"]}, "task": {"type": "worker", "index": 1}}
                )
            },
            TaskLayout(3, 1, "tf_config"),
        ),
    ],
)
def test_task_layout(environ, expected):
    assert task_layout(environ) == expected


def test_single_task_passes_and_many_tasks_are_refused_with_the_fix():
    require_single_task({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"})
    with pytest.raises(ValueError, match=r"step starts 2 tasks \(slurm\).*one task per job step"):
        require_single_task({"SLURM_JOB_ID": "9", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"})
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        require_single_task({"TF_CONFIG": "{not json"})
