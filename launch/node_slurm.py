"""`python -m launch.node_slurm up|down|status|cut`: the old name of `python -m launch.testslurm.node_slurm`
(the N-node test Slurm, `launch/testslurm/node_slurm.py`), kept for the commands written before launch/ had
rooms (0.7.0 and earlier: docs, benchmark notes, a user's shell history).
"""

import sys

from launch.testslurm.node_slurm import main

if __name__ == "__main__":
    sys.exit(main())
