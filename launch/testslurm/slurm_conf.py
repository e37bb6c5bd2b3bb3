"""The configuration of a Slurm of our own on this machine (a *site*): local_slurm.py's one node and
node_slurm.py's N. Each site has a directory of its own (slurm.conf, cgroup.conf, state, spool,
pid files, logs; /etc/slurm is never written), a ClusterName, ports and first job id of its own, so that sites
run side by side: the test session may have both up. Pure text and directories; the daemons are
slurm_daemons.py's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

DEFAULT_PORTS = (6817, 6818)  # SlurmctldPort, SlurmdPort
# The smallest cred_expire Slurm 22.05 accepts (4 logs "AuthInfo=cred_expire=4 invalid" and falls back to 120).
# A requeued job becomes eligible cred_expire + 1 s after it ended: 6 s here instead of 121 s.
CRED_EXPIRE_SEC = 5
# The main scheduling loop (default every 60 s) is what starts a requeued job once it is eligible again.
SCHEDULER = "sched_interval=1,bf_interval=1"
SLURM_CONF = """\
# Written by {writer}; rewritten (and the daemons restarted) when it changes.
ClusterName={cluster}
SlurmctldHost={host}({controller})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
FirstJobId={first_job_id}
AuthType=auth/munge
{auth_info}SlurmUser=root
ProctrackType={proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters={sched}
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=3600
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=debug
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}\
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=0
PartitionName=urgent Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
"""
NODE_LINE = "NodeName={name} NodeAddr={address} {hardware} RealMemory={memory} State=UNKNOWN\n"
CGROUP_CONF = """\
CgroupPlugin=cgroup/{version}
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
"""
CGROUP_V2_EXTRA = "IgnoreSystemdOnFailure=yes\n"  # containers without systemd: slurmd builds the hierarchy itself


@dataclasses.dataclass(frozen=True)
class Site:
    """One Slurm of ours: where it lives and what keeps it apart from the machine's other Slurms."""

    root: Path
    cluster: str
    controller: str  # the address slurmd and the clients reach slurmctld at
    ports: tuple[int, int] = DEFAULT_PORTS  # SlurmctldPort, SlurmdPort
    proctrack: str = "proctrack/cgroup"
    first_job_id: int = 1  # distinct per site: job ids (and the trainer ports derived from them) tell sites apart
    writer: str = "launch/testslurm/local_slurm.py"

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm command needs in its environment to talk to this site."""
        return {"SLURM_CONF": str(self.conf)}


@dataclasses.dataclass(frozen=True)
class Machine:
    """This machine as `slurmd -C` sees it (slurm_daemons.machine)."""

    host: str  # the short host name, which slurmctld must find in SlurmctldHost
    hardware: str  # CPUs=... Boards=... SocketsPerBoard=... CoresPerSocket=... ThreadsPerCore=...
    memory: int  # MB to declare: a bit below what slurmd reports, or the node drains
    cpus: int


def render(
    site: Site, machine: Machine, nodes: dict[str, str], cred_expire_sec: int | None = CRED_EXPIRE_SEC
) -> tuple[str, str]:
    """(slurm.conf, cgroup.conf) of `site` with `nodes` (name -> address), each node the whole `machine`.
    `cred_expire_sec` None keeps Slurm's default (120 s: a requeued job waits 121 s before it may start again)."""
    node_lines = "".join(
        NODE_LINE.format(name=name, address=address, hardware=machine.hardware, memory=machine.memory)
        for name, address in nodes.items()
    )
    values = {
        **dataclasses.asdict(site),
        "host": machine.host,
        "ctld_port": site.ports[0],
        "slurmd_port": site.ports[1],
        "auth_info": "" if cred_expire_sec is None else f"AuthInfo=cred_expire={cred_expire_sec}\n",
        "sched": SCHEDULER,
        "nodes": node_lines,
    }
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()  # the unified hierarchy; v1 mounts one dir per controller
    cgroup_conf = CGROUP_CONF.format(version="v2" if v2 else "v1") + (CGROUP_V2_EXTRA if v2 else "")
    return SLURM_CONF.format(**values), cgroup_conf


def write_config(site: Site, slurm_conf: str, cgroup_conf: str, nodes: list[str]) -> bool:
    """Creates the site's directories (a spool per node) and writes slurm.conf and cgroup.conf; True if either
    file changed."""
    for sub in ("etc", "state", "run", "log", *(f"spool/{node}" for node in nodes)):
        (site.root / sub).mkdir(parents=True, exist_ok=True)
    files = ((site.conf, slurm_conf), (site.conf.parent / "cgroup.conf", cgroup_conf))
    stale = [(path, text) for path, text in files if not path.exists() or path.read_text() != text]
    for path, text in stale:
        path.write_text(text)
    return bool(stale)
