"""A real Slurm of N nodes on this machine (two by default), for what a job of several machines meets that one
node never shows (a node's link going down, a step spread over several slurmd, a job whose node count changes
between attempts): `python -m launch.testslurm.node_slurm up [--nodes=N] [--cred_expire=SEC|default] | down | status |
cut NODE SECONDS`.

N slurmd, nodes tfn1 .. tfnN, each in a network namespace of its own behind a real veth pair (netns.py's
`Network` on the bridge br-tf2n: 10.79.0.11, .12, ..., the host 10.79.0.1) and in a UTS namespace whose host
name is the node's; one slurmctld on the host, reached on the bridge. The node names resolve inside the
namespaces and on the host (`Network.publish_names`): a job's tasks find each other by node name, as
launch.job.cluster names them. A site of its own (slurm_conf.py): /var/lib/towerflow-slurm-nodes (or
$TOWERFLOW_SLURM_NODES_DIR), ClusterName towerflownodes, ports 6917/6918, job ids from 1001, so it runs beside
local_slurm.py's one-node Slurm; namespaces, bridge and addresses differ from netns.WIRE's
(tests/launch/test_wire.py). The node count is part of slurm.conf: `up` with another count than the running one
rewrites it and restarts the daemons (a few seconds; a namespace left from a larger count stays, unused, until
`down`). It uses proctrack/linuxproc: every slurmd shares the machine's one cgroup tree, where
proctrack/cgroup would put a job's steps on several nodes in one directory. The requeue hold and scheduler
are the short ones of the one-node Slurm, unless `up(cred_expire_sec=None)` asks for Slurm's default hold.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from launch.testslurm import netns, slurm_daemons
from launch.testslurm.slurm_conf import CRED_EXPIRE_SEC, Site, render
from launch.testslurm.slurm_daemons import SlurmUnavailable

ROOT = Path(os.environ.get("TOWERFLOW_SLURM_NODES_DIR", "/var/lib/towerflow-slurm-nodes"))
# The bridge and veth names date from when it had two nodes; kept, so that namespaces left by then are reused.
NET = netns.Network(bridge="br-tf2n", subnet="10.79.0", prefix="tfn", veth_prefix="v2n")
DEFAULT_NODES = 2
SITE = Site(
    ROOT,
    cluster="towerflownodes",
    controller=NET.host_address,
    ports=(6917, 6918),
    proctrack="proctrack/linuxproc",
    first_job_id=1001,
    writer="launch/testslurm/node_slurm.py",
)


def node_names(count: int) -> tuple[str, ...]:
    """The names of the nodes of a `count`-node Slurm: tfn1 .. tfn<count>."""
    return tuple(NET.namespace(i) for i in range(1, count + 1))


@dataclasses.dataclass(frozen=True)
class NodeSlurm(slurm_daemons.Running):
    """The running N-node Slurm: add `env` to the environment of every Slurm command."""

    nodes: tuple[str, ...]
    cpus: int  # per node: each node declares the whole machine
    partitions: tuple[str, ...]

    def cut(self, node: str, seconds: float) -> None:
        cut(node, seconds)

    def set_state(self, node: str, state: str) -> None:
        """`scontrol update NodeName=node State=state`: DRAIN (no new job starts there; the reason says it was
        a test) or RESUME."""
        reason = ["Reason=towerflow-test"] if state.upper() == "DRAIN" else []
        slurm_daemons.run(["scontrol", "update", f"NodeName={node}", f"State={state}", *reason], self.env)


def up(count: int = DEFAULT_NODES, cred_expire_sec: int | None = CRED_EXPIRE_SEC) -> NodeSlurm:
    """Starts (or reuses) the namespaces, munged, slurmctld and `count` slurmd, and waits until every node takes
    jobs. A running one with another count or `cred_expire_sec` (None: Slurm's default) is restarted with these.

    Raises:
      ValueError: `count` is not between 1 and netns.MAX_NAMESPACES.
      SlurmUnavailable: no root, no Slurm, or a daemon did not come up; the message says which.
    """
    if not 1 <= count <= netns.MAX_NAMESPACES:
        raise ValueError(f"between 1 and {netns.MAX_NAMESPACES} nodes, not {count}")
    nodes = node_names(count)
    machine = slurm_daemons.machine()
    addresses = {node: NET.address(i) for i, node in enumerate(nodes, 1)}
    slurm_conf, cgroup_conf = render(SITE, machine, addresses, cred_expire_sec)
    running = slurm_daemons.configure(SITE, slurm_conf, cgroup_conf, list(nodes))
    try:
        if os.geteuid() == 0:  # without root, configure() has made sure that everything runs already
            NET.up(count)
            NET.publish_names(count, {machine.host: NET.host_address})
        slurm_daemons.start_controller(SITE, running)
        started = {node for node in nodes if node not in _slurmd_nodes(running)}
        for node in sorted(started):
            _start_slurmd(node)
    except netns.NetnsUnavailable as e:
        raise SlurmUnavailable(str(e)) from e
    logs = (SITE.log_dir / "slurmctld.log", *(SITE.log_dir / f"slurmd-{node}.log" for node in nodes))
    ready = lambda: all([slurm_daemons.node_ready(SITE, node) for node in nodes])  # a list: resume every node
    slurm_daemons.wait(f"nodes {', '.join(nodes)} idle", ready, logs=logs)
    return NodeSlurm(
        conf=SITE.conf,
        env=SITE.env,
        started_here=bool(started) or not running["slurmctld"],
        log_dir=SITE.log_dir,
        nodes=nodes,
        cpus=machine.cpus,
        partitions=("debug", "urgent"),
    )


def _slurmd_nodes(running: dict[str, list]) -> set[str]:
    """The nodes whose slurmd runs (each was started with `-N <node>`)."""
    return {argv[argv.index("-N") + 1] for _, argv in running["slurmd"] if "-N" in argv[:-1]}


def _start_slurmd(node: str) -> None:
    """`node`'s slurmd, in its network namespace and a UTS namespace of its own named after the node (what
    `hostname` says in its jobs). slurmd forks into the background: this returns once it has."""
    command = f"hostname {node} && exec slurmd -f {SITE.conf} -N {node}"
    slurm_daemons.run(["ip", "netns", "exec", node, "unshare", "--uts", "sh", "-c", command])


def down() -> None:
    """Cancels every job, stops slurmctld and every slurmd, and removes the namespaces, the bridge and the node
    names (munged, shared with the one-node Slurm, stays). A no-op for what is not there."""
    slurm_daemons.stop(SITE)
    try:
        NET.down()
    except netns.NetnsUnavailable as e:
        raise SlurmUnavailable(str(e)) from e


def cut(node: str, seconds: float) -> None:
    """Takes `node`'s link down for `seconds`, then up again: for that long nothing reaches the node or leaves
    it (slurmctld, the other nodes, the job's other tasks) while its processes run on, as when a cable or a
    switch port fails. Blocks; call it from a thread to act during the outage.

    Raises:
      ValueError: no such node (its namespace does not exist).
    """
    if node not in NET.namespaces():
        raise ValueError(f"no node {node!r}: the nodes are {', '.join(NET.namespaces()) or 'none (not up)'}")
    NET.set_link(NET.index(node), up=False)
    try:
        time.sleep(seconds)
    finally:
        NET.set_link(NET.index(node), up=True)


def status() -> str:
    """The daemons, `sinfo -N`, `squeue`, and each node's namespace and link."""
    links = [f"{ns} {NET.address(NET.index(ns))}: {NET.link(NET.index(ns))}\n" for ns in NET.namespaces()]
    return slurm_daemons.status(SITE) + "".join(links)


def main(argv: list[str] | None = None) -> int:
    """CLI: `up [--nodes=N]` installs and starts (or reuses), `down` stops and cleans up, `status`, `cut NODE
    SECONDS`."""
    parser = argparse.ArgumentParser(prog="python -m launch.testslurm.node_slurm", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status", "cut"))
    parser.add_argument("node", nargs="?", help="cut: the node whose link goes down (tfn1, tfn2, ...)")
    parser.add_argument("seconds", nargs="?", type=float, help="cut: for how long")
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="up: how many nodes")
    parser.add_argument("--cred_expire", default=str(CRED_EXPIRE_SEC), help="up: seconds, or 'default' (120)")
    args = parser.parse_args(argv)
    if (args.command == "cut") != (args.seconds is not None):
        parser.error("NODE SECONDS go with cut, and only with it")
    try:
        if args.command == "up":
            slurm_daemons.install()
            slurm = up(args.nodes, None if args.cred_expire == "default" else int(args.cred_expire))
            print(f"{'started' if slurm.started_here else 'reused'} Slurm on {', '.join(slurm.nodes)}")
            print(f"logs in {slurm.log_dir}\nexport SLURM_CONF={slurm.conf}")
        elif args.command == "down":
            down()
        elif args.command == "cut":
            cut(args.node, args.seconds)
        else:
            print(status(), end="")
    except (SlurmUnavailable, netns.NetnsUnavailable, ValueError) as e:
        print(f"Slurm unavailable: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
