"""`python -m trainer.outputs.lost`: the oldest name of `python -m launch.job.lost`, kept for jobs already queued.

Slurm keeps a job's batch script as it was rendered at submission and runs it again on every requeue, so a
week-long job submitted before the tool moved to `launch/` (0.3.1 and earlier) still calls this name after
the installed towerflow is upgraded. Without it, that job's batch shell would fail to requeue after a lost
task. New jobs call `launch.job.lost` (`launch/submit/sbatch.py`); `launch.lost` (`launch/lost.py`) is its name
from 0.4.0 to 0.7.0, kept the same way.
"""

import sys

from launch.job.lost import main

if __name__ == "__main__":
    sys.exit(main())
