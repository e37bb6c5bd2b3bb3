"""A one-node Slurm (22.05, Debian's packages) that the tests bring up themselves, idempotently:
`python -m launch.testslurm.local_slurm up|down|status`.

Everything lives in a directory of our own (/var/lib/towerflow-slurm, or $TOWERFLOW_SLURM_DIR): slurm.conf,
cgroup.conf, state, spool, pid files and logs; /etc/slurm is never written. The daemons run with `-f <our conf>`
and `LocalSlurm.env` holds SLURM_CONF for the client commands. Jobs get SLURM_CONF too (through sbatch's default
--export=ALL, and from slurmd even with --export=NONE), so `scontrol` inside a job reaches this controller.
Slurm's default ports, on 127.0.0.1; node_slurm.py's Slurm can run beside it (other ports and
directory). What the two share (packages, munge, config, daemons): slurm_conf.py, slurm_daemons.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from launch.testslurm import slurm_daemons
from launch.testslurm.slurm_conf import Site, render
from launch.testslurm.slurm_daemons import SlurmUnavailable, install  # noqa: F401 (this module's interface since it began)

ROOT = Path(os.environ.get("TOWERFLOW_SLURM_DIR", "/var/lib/towerflow-slurm"))
ADDRESS = "127.0.0.1"  # of the node and of slurmctld
SITE = Site(ROOT, cluster="towerflowtest", controller=ADDRESS)
CONF = SITE.conf
LOG_DIR = SITE.log_dir


@dataclasses.dataclass(frozen=True)
class LocalSlurm(slurm_daemons.Running):
    """The running one-node Slurm: add `env` to the environment of every Slurm command."""

    node: str
    cpus: int
    partitions: tuple[str, ...]


def up() -> LocalSlurm:
    """Starts (or reuses) munged and our slurmctld and slurmd, and waits until the node takes jobs."""
    machine = slurm_daemons.machine()
    slurm_conf, cgroup_conf = render(SITE, machine, {machine.host: ADDRESS})
    running = slurm_daemons.configure(SITE, slurm_conf, cgroup_conf, [machine.host])
    slurm_daemons.start_controller(SITE, running)
    if not running["slurmd"]:
        slurm_daemons.run(["slurmd", "-f", str(CONF)])
    logs = (LOG_DIR / "slurmctld.log", LOG_DIR / f"slurmd-{machine.host}.log")
    slurm_daemons.wait(f"node {machine.host} idle", lambda: slurm_daemons.node_ready(SITE, machine.host), logs=logs)
    return LocalSlurm(
        conf=CONF,
        env=SITE.env,
        started_here=not all(running.values()),
        log_dir=LOG_DIR,
        node=machine.host,
        cpus=machine.cpus,
        partitions=("debug", "urgent"),
    )


def down() -> None:
    """Cancels every job, shuts our slurmctld and slurmd down and waits for them to exit (munged stays)."""
    slurm_daemons.stop(SITE)


def main(argv: list[str] | None = None) -> int:
    """CLI: `up` installs and starts (or reuses), `down` stops, `status` shows the daemons, sinfo and squeue."""
    parser = argparse.ArgumentParser(
        prog="python -m launch.testslurm.local_slurm", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=("up", "down", "status"))
    command = parser.parse_args(argv).command
    try:
        if command == "up":
            install()
            slurm = up()
            print(f"{'started' if slurm.started_here else 'reused'} Slurm on {slurm.node} ({slurm.cpus} CPUs)")
            print(f"logs in {slurm.log_dir}\nexport SLURM_CONF={slurm.conf}")
        elif command == "down":
            down()
        else:
            print(slurm_daemons.status(SITE), end="")
    except SlurmUnavailable as e:
        print(f"Slurm unavailable: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
