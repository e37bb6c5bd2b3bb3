"""launch.cluster: the task layout from Slurm/TF_CONFIG variables, and the single-task guard."""

import json

import pytest

from launch.cluster import TaskLayout, require_single_task, task_layout


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, TaskLayout(1, 0, "none")),
        ({"SLURM_NTASKS": "4", "SLURM_PROCID": "3"}, TaskLayout(4, 3, "slurm")),
        ({"SLURM_NPROCS": "2"}, TaskLayout(2, 0, "slurm")),
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
    require_single_task({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"})
    with pytest.raises(ValueError, match=r"starts 2 tasks \(slurm\).*#SBATCH --ntasks=1"):
        require_single_task({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"})
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        require_single_task({"TF_CONFIG": "{not json"})
