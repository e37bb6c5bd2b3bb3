"""`python -m benchmarks.machines NAME [ARGS]`: what several machines, or several devices, cost.

Each command trains with `python -m trainer` processes (or counts a traced step) and takes minutes; none is part
of the headline table (`python -m benchmarks`). Results: benchmarks/results/machines.md.
"""

import sys

from benchmarks.harness import commands

COMMANDS = {
    "traffic": "benchmarks.machines.traffic",
    "multinode": "benchmarks.machines.multinode",
    "wire": "benchmarks.machines.wire",
    "scaling": "benchmarks.machines.scaling",
    "peers": "benchmarks.machines.peers",
}

if __name__ == "__main__":
    sys.exit(commands.dispatch("python -m benchmarks.machines", COMMANDS, sys.argv[1:]))
