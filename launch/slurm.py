"""`python -m launch.slurm`: the launcher's command (README, docs/slurm.md), kept short at the top of launch/;
the launcher itself is `launch/submit/slurm.py`.
"""

import sys

from launch.submit.slurm import main

if __name__ == "__main__":
    sys.exit(main())
