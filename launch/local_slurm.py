"""A one-node Slurm (22.05, Debian's packages) that the tests bring up themselves, idempotently:
`python -m launch.local_slurm up|down|status`.

Everything lives in a directory of our own (/var/lib/towerflow-slurm, or $TOWERFLOW_SLURM_DIR): slurm.conf,
cgroup.conf, state, spool, pid files and logs; /etc/slurm is never written. The daemons run with `-f <our conf>`
and `LocalSlurm.env` holds SLURM_CONF for the client commands. Jobs get SLURM_CONF too (through sbatch's default
--export=ALL, and from slurmd even with --export=NONE), so `scontrol` inside a job reaches this controller.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(os.environ.get("TOWERFLOW_SLURM_DIR", "/var/lib/towerflow-slurm"))
CONF = ROOT / "etc" / "slurm.conf"
LOG_DIR = ROOT / "log"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
MUNGE_LOG = Path("/var/log/munge/munged.log")
# The smallest cred_expire Slurm 22.05 accepts (4 logs "AuthInfo=cred_expire=4 invalid" and falls back to 120).
# A requeued job becomes eligible cred_expire + 1 s after it ended: 6 s here instead of 121 s.
CRED_EXPIRE_SEC = 5
# The main scheduling loop (default every 60 s) is what starts a requeued job once it is eligible again.
SCHEDULER = "sched_interval=1,bf_interval=1"
SLURM_CONF = """\
# Written by launch/local_slurm.py; rewritten (and the daemons restarted) when it changes.
ClusterName=towerflowtest
SlurmctldHost={node}(127.0.0.1)
AuthType=auth/munge
AuthInfo=cred_expire={cred}
SlurmUser=root
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters={sched}
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=3600
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=debug
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={node} NodeAddr=127.0.0.1 {hardware} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=0
PartitionName=urgent Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
"""
CGROUP_CONF = """\
CgroupPlugin=cgroup/{version}
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
"""
CGROUP_V2_EXTRA = "IgnoreSystemdOnFailure=yes\n"  # containers without systemd: slurmd builds the hierarchy itself


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or started here; the message says why."""


def _run(cmd: list[str], env: dict[str, str] | None = None, check: bool = True, **kwargs) -> str:
    """Runs a command with our SLURM_CONF (and `env`) in its environment; returns stdout, raises on failure."""
    full_env = {**os.environ, "PATH": SEARCH_PATH, "SLURM_CONF": str(CONF), **(env or {})}
    result = subprocess.run(cmd, env=full_env, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited with {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def _tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, or a note that it does not exist."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else f"(no {path})"


@dataclasses.dataclass(frozen=True)
class LocalSlurm:
    """A running one-node Slurm: add `env` to the environment of every Slurm command."""

    conf: Path
    node: str
    cpus: int
    partitions: tuple[str, ...]
    env: dict[str, str]
    started_here: bool
    log_dir: Path = LOG_DIR  # slurmctld.log, slurmd.log (SlurmdDebug=debug: which signal went to which step)

    def sbatch(self, args: list[str], cwd: str | Path) -> int:
        """Submits a batch job (`sbatch --parsable ARGS` in `cwd`) and returns its job id."""
        out = _run(["sbatch", "--parsable", *args], env=self.env, cwd=str(cwd))
        return int(out.strip().split(";")[0])

    def job_info(self, job_id: int) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict: JobState, ExitCode, Restarts, RunTime, StartTime, ..."""
        line = _run(["scontrol", "show", "job", "-o", str(job_id)], env=self.env).strip()
        return dict(re.findall(r"(?:^| )([A-Za-z][\w/:]*)=(.*?)(?= [A-Za-z][\w/:]*=|$)", line))

    def wait_for_state(self, job_id: int, states: set[str], timeout_sec: float) -> dict[str, str]:
        """Polls `job_info` every second until JobState is one of `states`; raises TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_sec
        while (info := self.job_info(job_id)).get("JobState") not in states:
            if time.monotonic() > deadline:
                log = _tail(self.log_dir / "slurmctld.log")
                raise TimeoutError(f"job {job_id} not {sorted(states)} after {timeout_sec} s: {info}\n{log}")
            time.sleep(1)
        return info


def install() -> None:
    """Installs Debian's Slurm and munge packages if a program is missing; SlurmUnavailable where it cannot."""
    missing = lambda: [c for c in ("slurmctld", "slurmd", "sbatch", "munged") if not shutil.which(c, path=SEARCH_PATH)]
    if not missing():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"{', '.join(missing())} missing, and installing them needs root and apt-get")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        _run(["apt-get", "update", "-qq"], env=env)
        _run(["apt-get", "install", "-y", "-qq", *PACKAGES], env=env)
    except RuntimeError as e:
        raise SlurmUnavailable(str(e)) from e
    if missing():
        raise SlurmUnavailable(f"{', '.join(missing())} still missing after apt-get install")


def _daemons(name: str) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every running daemon `name` (comm and argv[0] both say so)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == name:
                argv = (proc / "cmdline").read_text().split("\0")[:-1]
                if argv and Path(argv[0]).name == name:  # not a zombie, nor a renamed helper (slurmscriptd)
                    found.append((int(proc.name), argv))
        except OSError:
            continue
    return found


def _running() -> dict[str, bool]:
    """Which of our daemons run; raises SlurmUnavailable if a slurmctld or slurmd with another conf runs."""
    state = {}
    for name in ("slurmctld", "slurmd"):
        procs = _daemons(name)
        for pid, argv in procs:
            if "-f" not in argv or argv[argv.index("-f") + 1 :][:1] != [str(CONF)]:
                raise SlurmUnavailable(f"{name} pid {pid} runs without -f {CONF}: another Slurm; not touching it")
        state[name] = bool(procs)
    return state


def _wait(what: str, ready, timeout_sec: float = 60, logs: tuple[Path, ...] = ()) -> None:
    """Polls `ready()` every 0.2 s; after `timeout_sec` raises SlurmUnavailable with the tails of `logs`."""
    deadline = time.monotonic() + timeout_sec
    while not ready():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {log} ---\n{_tail(log, 15)}" for log in logs)
            raise SlurmUnavailable(f"{what}: not after {timeout_sec} s\n{tails}")
        time.sleep(0.2)


def _start_munge() -> None:
    """Unless `munge -n | unmunge` works: creates the key and directories if missing and starts munged."""
    works = lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0
    if works():
        return
    if _daemons("munged"):
        raise SlurmUnavailable(f"munged runs but `munge -n | unmunge` fails: {_tail(MUNGE_LOG, 5)}")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        _run(["mungekey", "--create", f"--keyfile={key}"])
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    for path in (Path("/run/munge"), MUNGE_LOG.parent, Path("/var/lib/munge")):
        path.mkdir(parents=True, exist_ok=True)
        shutil.chown(path, "munge", "munge")
    _run(["runuser", "-u", "munge", "--", "munged", "--force"])
    _wait("munged answering", works, timeout_sec=10, logs=(MUNGE_LOG,))


def _render_config() -> tuple[str, str, str, int]:
    """(slurm.conf, cgroup.conf, node name, CPUs) for this machine, from `slurmd -C`."""
    fields = dict(re.findall(r"(\w+)=(\S+)", _run(["slurmd", "-C"]).splitlines()[0]))
    hardware = " ".join(f"{k}={fields[k]}" for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket"))
    hardware += f" ThreadsPerCore={fields['ThreadsPerCore']}"
    memory = max(int(fields["RealMemory"]) * 9 // 10, 1)  # a bit below what slurmd reports, or the node drains
    slurm_conf = SLURM_CONF.format(
        node=fields["NodeName"], hardware=hardware, memory=memory, root=ROOT, cred=CRED_EXPIRE_SEC, sched=SCHEDULER
    )
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()  # the unified hierarchy; v1 mounts one dir per controller
    cgroup_conf = CGROUP_CONF.format(version="v2" if v2 else "v1") + (CGROUP_V2_EXTRA if v2 else "")
    return slurm_conf, cgroup_conf, fields["NodeName"], int(fields["CPUs"])


def _write_config(slurm_conf: str, cgroup_conf: str) -> bool:
    """Creates our directories and writes slurm.conf and cgroup.conf; True if either file changed."""
    for sub in ("etc", "state", "spool", "run", "log"):
        (ROOT / sub).mkdir(parents=True, exist_ok=True)
    files = ((CONF, slurm_conf), (CONF.parent / "cgroup.conf", cgroup_conf))
    stale = [(path, text) for path, text in files if not path.exists() or path.read_text() != text]
    for path, text in stale:
        path.write_text(text)
    return bool(stale)


def _node_ready(node: str) -> bool:
    """Whether the node is idle (or busy); resumes it if it is down or drained but reachable."""
    found = re.search(r"State=(\S+)", _run(["scontrol", "show", "node", "-o", node], check=False))
    state = found.group(1) if found else "UNKNOWN*"  # "*": not responding
    if any(s in state for s in ("DOWN", "DRAIN", "FAIL")) and "*" not in state:
        _run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        return False
    return state.split("+")[0] in ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")


def up() -> LocalSlurm:
    """Starts (or reuses) munged and our slurmctld and slurmd, and waits until the node takes jobs."""
    running = _running()
    slurm_conf, cgroup_conf, node, cpus = _render_config()
    if os.geteuid() != 0:  # without root, only a running Slurm of ours with this very config will do
        if not (all(running.values()) and CONF.exists() and CONF.read_text() == slurm_conf):
            raise SlurmUnavailable(f"starting Slurm (or changing {CONF}) needs root")
    else:
        _start_munge()
        if _write_config(slurm_conf, cgroup_conf) and any(running.values()):
            down()  # our daemons run an older config: restart them
            running = {"slurmctld": False, "slurmd": False}
    logs = (LOG_DIR / "slurmctld.log", LOG_DIR / "slurmd.log")
    if not running["slurmctld"]:
        _run(["slurmctld", "-c", "-f", str(CONF)])  # -c: no jobs or node states from an earlier session
    _wait("slurmctld answering", lambda: "is UP" in _run(["scontrol", "ping"], check=False), logs=logs)
    if not running["slurmd"]:
        _run(["slurmd", "-f", str(CONF)])
    _wait(f"node {node} idle", lambda: _node_ready(node), logs=logs)
    env = {"SLURM_CONF": str(CONF)}
    return LocalSlurm(CONF, node, cpus, ("debug", "urgent"), env, started_here=not all(running.values()))


def down() -> None:
    """Cancels every job, shuts our slurmctld and slurmd down and waits for them to exit (munged stays)."""
    if not any(_running().values()):
        return
    jobs = lambda: _run(["squeue", "-h", "-o", "%i"], check=False).split()
    if jobs():
        _run(["scancel", *jobs()], check=False)
        with contextlib.suppress(SlurmUnavailable):  # after 45 s (KillWait=30 s), shut down anyway
            _wait("jobs gone", lambda: not jobs(), timeout_sec=45)
    _run(["scontrol", "shutdown"], check=False)
    stopped = lambda: not any(_running().values())
    try:
        _wait("slurmctld and slurmd exit", stopped, timeout_sec=30)
    except SlurmUnavailable:  # e.g. a slurmd whose slurmctld is gone: stop our daemons by pid
        for pid, _ in _daemons("slurmctld") + _daemons("slurmd"):
            os.kill(pid, signal.SIGTERM)
        _wait("slurmctld and slurmd exit after SIGTERM", stopped, timeout_sec=30)


def main(argv: list[str] | None = None) -> int:
    """CLI: `up` installs and starts (or reuses), `down` stops, `status` shows the daemons, sinfo and squeue."""
    parser = argparse.ArgumentParser(prog="python -m launch.local_slurm", description=__doc__.split("\n\n")[0])
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
            running = _running()
            print(f"{CONF} (logs in {LOG_DIR}): running {running}")
            print(_run(["sinfo"], check=False) + _run(["squeue"], check=False) if running["slurmctld"] else "", end="")
    except SlurmUnavailable as e:
        print(f"Slurm unavailable: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
