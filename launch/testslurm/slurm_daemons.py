"""The daemons of a Slurm of our own on this machine (a *site*, slurm_conf.py): Debian's Slurm 22.05 and
munge packages, one munged for every site, and per site a slurmctld and its slurmd, found among the machine's
processes by their `-f <the site's conf>`, started, waited for and stopped. Daemons of other confs are left
alone: another site's, or a Slurm of someone else's, which stops us only if it uses one of the site's ports.
Client commands get the site's SLURM_CONF from `Site.env`. Jobs get it too (sbatch's default --export=ALL, and
from slurmd even with --export=NONE), so `scontrol` inside a job reaches its own controller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from launch.testslurm.slurm_conf import DEFAULT_PORTS, Machine, Site, write_config

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
MUNGE_LOG = Path("/var/log/munge/munged.log")
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")  # what a daemon started without -f or SLURM_CONF reads


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or started here; the message says why."""


def run(cmd: list[str], env: dict[str, str] | None = None, check: bool = True, **kwargs) -> str:
    """Runs a command with `env` (a site's SLURM_CONF for Slurm's commands) added; returns stdout, raises on failure."""
    result = subprocess.run(
        cmd, env={**os.environ, "PATH": SEARCH_PATH, **(env or {})}, capture_output=True, text=True, **kwargs
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited with {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, or a note that it does not exist."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else f"(no {path})"


@dataclasses.dataclass(frozen=True)
class Running:
    """A running Slurm of ours: add `env` to the environment of every Slurm command."""

    conf: Path
    env: dict[str, str]
    started_here: bool
    log_dir: Path  # slurmctld.log, slurmd-<node>.log (SlurmdDebug=debug: which signal went to which step)

    def sbatch(self, args: list[str], cwd: str | Path) -> int:
        """Submits a batch job (`sbatch --parsable ARGS` in `cwd`) and returns its job id."""
        out = run(["sbatch", "--parsable", *args], env=self.env, cwd=str(cwd))
        return int(out.strip().split(";")[0])

    def job_info(self, job_id: int) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict: JobState, ExitCode, Restarts, RunTime, StartTime, ..."""
        line = run(["scontrol", "show", "job", "-o", str(job_id)], env=self.env).strip()
        return dict(re.findall(r"(?:^| )([A-Za-z][\w/:]*)=(.*?)(?= [A-Za-z][\w/:]*=|$)", line))

    def wait_for_state(self, job_id: int, states: set[str], timeout_sec: float) -> dict[str, str]:
        """Polls `job_info` every second until JobState is one of `states`; raises TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_sec
        while (info := self.job_info(job_id)).get("JobState") not in states:
            if time.monotonic() > deadline:
                log = tail(self.log_dir / "slurmctld.log")
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
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", *PACKAGES], env=env)
    except RuntimeError as e:
        raise SlurmUnavailable(str(e)) from e
    if missing():
        raise SlurmUnavailable(f"{', '.join(missing())} still missing after apt-get install")


def daemons(name: str) -> list[tuple[int, list[str]]]:
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


def _conf_of(pid: int, argv: list[str]) -> Path:
    """The slurm.conf a daemon reads: its -f, else the SLURM_CONF it was started with, else the system's."""
    if "-f" in argv[:-1]:
        return Path(argv[argv.index("-f") + 1])
    with contextlib.suppress(OSError):
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(b"SLURM_CONF="):
                return Path(entry[len(b"SLURM_CONF=") :].decode(errors="replace"))
    return SYSTEM_CONF


def _ports_of(conf: Path) -> set[int]:
    """The SlurmctldPort and SlurmdPort a slurm.conf sets (Slurm's defaults where it does not, or is unreadable)."""
    try:
        text = conf.read_text(errors="replace")
    except OSError:
        text = ""
    found = [re.search(rf"^\s*{key}\s*=\s*(\d+)", text, re.M | re.I) for key in ("SlurmctldPort", "SlurmdPort")]
    return {int(m[1]) if m else default for m, default in zip(found, DEFAULT_PORTS, strict=True)}


def running(site: Site) -> dict[str, list[tuple[int, list[str]]]]:
    """The site's running slurmctld and slurmd, as (pid, argv). Daemons of other confs are left alone, unless
    they use one of the site's ports: then SlurmUnavailable (another Slurm is in the way; not touching it)."""
    state = {}
    for name in ("slurmctld", "slurmd"):
        state[name] = []
        for pid, argv in daemons(name):
            conf = _conf_of(pid, argv)
            if conf == site.conf:
                state[name].append((pid, argv))
            elif _ports_of(conf) & set(site.ports):
                raise SlurmUnavailable(f"{name} pid {pid} ({conf}) uses a port of {site.conf}: another Slurm")
    return state


def wait(what: str, ready, timeout_sec: float = 60, logs: tuple[Path, ...] = ()) -> None:
    """Polls `ready()` every 0.2 s; after `timeout_sec` raises SlurmUnavailable with the tails of `logs`."""
    deadline = time.monotonic() + timeout_sec
    while not ready():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {log} ---\n{tail(log, 15)}" for log in logs)
            raise SlurmUnavailable(f"{what}: not after {timeout_sec} s\n{tails}")
        time.sleep(0.2)


def start_munge() -> None:
    """Unless `munge -n | unmunge` works: creates the key and directories if missing and starts munged."""
    works = lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0
    if works():
        return
    if daemons("munged"):
        raise SlurmUnavailable(f"munged runs but `munge -n | unmunge` fails: {tail(MUNGE_LOG, 5)}")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        run(["mungekey", "--create", f"--keyfile={key}"])
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    for path in (Path("/run/munge"), MUNGE_LOG.parent, Path("/var/lib/munge")):
        path.mkdir(parents=True, exist_ok=True)
        shutil.chown(path, "munge", "munge")
    run(["runuser", "-u", "munge", "--", "munged", "--force"])
    wait("munged answering", works, timeout_sec=10, logs=(MUNGE_LOG,))


def machine() -> Machine:
    """This machine, from `slurmd -C`."""
    fields = dict(re.findall(r"(\w+)=(\S+)", run(["slurmd", "-C"]).splitlines()[0]))
    hardware = " ".join(f"{k}={fields[k]}" for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket"))
    hardware += f" ThreadsPerCore={fields['ThreadsPerCore']}"
    memory = max(int(fields["RealMemory"]) * 9 // 10, 1)
    return Machine(fields["NodeName"], hardware, memory, int(fields["CPUs"]))


def configure(site: Site, slurm_conf: str, cgroup_conf: str, nodes: list[str]) -> dict[str, list]:
    """Starts munged and writes the config; stops the site's daemons if they run an older one. Returns what
    runs afterwards (as `running`). Without root, only a site already running this very config will do."""
    now = running(site)
    if os.geteuid() != 0:
        if not (all(now.values()) and site.conf.exists() and site.conf.read_text() == slurm_conf):
            raise SlurmUnavailable(f"starting Slurm (or changing {site.conf}) needs root")
        return now
    start_munge()
    if write_config(site, slurm_conf, cgroup_conf, nodes) and any(now.values()):
        stop(site)
        return {"slurmctld": [], "slurmd": []}
    return now


def start_controller(site: Site, now: dict[str, list]) -> None:
    """Starts the site's slurmctld unless it runs, and waits until it answers."""
    if not now["slurmctld"]:
        run(["slurmctld", "-c", "-f", str(site.conf)])  # -c: no jobs or node states from an earlier session
    answers = lambda: "is UP" in run(["scontrol", "ping"], env=site.env, check=False)
    wait("slurmctld answering", answers, logs=(site.log_dir / "slurmctld.log",))


def node_ready(site: Site, node: str) -> bool:
    """Whether the node is idle (or busy); resumes it if it is down or drained but reachable."""
    found = re.search(r"State=(\S+)", run(["scontrol", "show", "node", "-o", node], env=site.env, check=False))
    state = found.group(1) if found else "UNKNOWN*"  # "*": not responding
    if any(s in state for s in ("DOWN", "DRAIN", "FAIL")) and "*" not in state:
        run(["scontrol", "update", f"nodename={node}", "state=resume"], env=site.env, check=False)
        return False
    return state.split("+")[0] in ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")


def stop(site: Site) -> None:
    """Cancels every job of the site, shuts its slurmctld and slurmd down and waits for them to exit (munged,
    shared by every site, stays)."""
    if not any(running(site).values()):
        return
    jobs = lambda: run(["squeue", "-h", "-o", "%i"], env=site.env, check=False).split()
    if jobs():
        run(["scancel", *jobs()], env=site.env, check=False)
        with contextlib.suppress(SlurmUnavailable):  # after 45 s (KillWait=30 s), shut down anyway
            wait("jobs gone", lambda: not jobs(), timeout_sec=45)
    run(["scontrol", "shutdown"], env=site.env, check=False)
    stopped = lambda: not any(running(site).values())
    try:
        wait("slurmctld and slurmd exit", stopped, timeout_sec=30)
    except SlurmUnavailable:  # e.g. a slurmd whose slurmctld is gone, or cut off from it: by pid, ours only
        for pid, _ in [entry for entries in running(site).values() for entry in entries]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        wait("slurmctld and slurmd exit after SIGTERM", stopped, timeout_sec=30)


def status(site: Site) -> str:
    """Which of the site's daemons run, and its `sinfo -N` and `squeue` when its slurmctld runs."""
    now = running(site)
    text = f"{site.conf} (logs in {site.log_dir}): running " + ", ".join(f"{k} x{len(v)}" for k, v in now.items())
    if now["slurmctld"]:
        text += "\n" + run(["sinfo", "-N"], env=site.env, check=False) + run(["squeue"], env=site.env, check=False)
    return text + ("" if text.endswith("\n") else "\n")
