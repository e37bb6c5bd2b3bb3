"""`python -m launch.lost`: the old name of `python -m launch.job.lost`, kept for jobs already queued.

Slurm keeps a job's batch script as it was rendered at submission and runs it again on every requeue, so a job
submitted before the tool moved to `launch/job/` (0.7.0 and earlier) still calls this name after the installed
towerflow is upgraded. Without it, that job's batch shell would fail to requeue after a lost task. New jobs
call `launch.job.lost` (`launch/submit/sbatch.py`); `trainer.outputs.lost` is the name before this one.
"""

import sys

from launch.job.lost import main

if __name__ == "__main__":
    sys.exit(main())
