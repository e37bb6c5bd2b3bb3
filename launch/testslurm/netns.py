"""Network namespaces as stand-in machines, so each task of a multi-task run has its own network interface:
`python -m launch.testslurm.netns up N | down | status`.

Processes on 127.0.0.1 share `lo`, whose byte counter merges every task's traffic. Here task i runs in the
namespace `tfnode<i>` (i = 1..N) behind a veth pair: `eth0` inside with address 10.78.0.(10 + i)/24, the host
side `vtf<i>` on the bridge `br-tf` (10.78.0.1/24). Every byte a namespace sends or receives crosses its
veth, so the kernel's counters of the host side give that task's traffic alone (`read_counters`: host-side
rx = bytes the namespace sent). That is `WIRE`, the network of benchmarks.machines.wire and
tests/launch/test_wire.py; the module's functions are its methods. Another `Network` (other bridge, subnet and
names) can run beside it: node_slurm.py's nodes live on one (br-tf2n, 10.79.0.0/24, tfn1, tfn2, ...), and give
their namespaces names that resolve (`publish_names`). Needs root and iproute2's `ip`; stdlib only, no TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

PREFIX_LEN = 24
INNER_INTERFACE = "eth0"
MAX_NAMESPACES = 200  # addresses .11 .. .210
HOSTS = Path("/etc/hosts")
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/<file> over /etc/<file>


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no `ip`, or `ip` failed); the message says why."""


def _require() -> None:
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root (run as root, or skip what needs them)")
    if shutil.which("ip") is None:
        raise NetnsUnavailable("no `ip` command: install iproute2 (apt-get install iproute2)")


def _ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result.stdout


def _exists(interface: str) -> bool:
    return os.path.exists(f"/sys/class/net/{interface}")


@dataclasses.dataclass(frozen=True)
class Network:
    """Namespaces <prefix>1..N on one bridge, with host sides <veth_prefix><i>. Networks with distinct names
    and subnets never touch each other's namespaces, interfaces or host names, so each user owns one."""

    bridge: str
    subnet: str  # the first three octets; the bridge is .1, namespace i is .(10 + i)
    prefix: str
    veth_prefix: str

    @property
    def host_address(self) -> str:
        return f"{self.subnet}.1"

    def namespace(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def address(self, i: int) -> str:
        """The IPv4 address of namespace i (1-based) on the bridge."""
        return f"{self.subnet}.{10 + i}"

    def veth(self, i: int) -> str:
        """The host side of namespace i's veth pair, on the bridge."""
        return f"{self.veth_prefix}{i}"

    def index(self, name: str) -> int:
        """i of the namespace named `name`, or 0 if `name` is not one of this network's."""
        rest = name[len(self.prefix) :]
        return int(rest) if name.startswith(self.prefix) and rest.isdigit() else 0

    def namespaces(self) -> list[str]:
        """This network's namespaces that exist now."""
        names = (line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip())
        return sorted((n for n in names if self.index(n)), key=self.index)

    def up(self, n: int) -> list[str]:
        """Makes the bridge and namespaces 1..n (what exists already is kept); returns their addresses."""
        _require()
        if not 1 <= n <= MAX_NAMESPACES:
            raise ValueError(f"between 1 and {MAX_NAMESPACES} namespaces, not {n}")
        if not _exists(self.bridge):
            _ip("link", "add", self.bridge, "type", "bridge")
        if f"{self.host_address}/" not in _ip("-4", "addr", "show", "dev", self.bridge):
            _ip("addr", "add", f"{self.host_address}/{PREFIX_LEN}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        existing = set(self.namespaces())
        for i in range(1, n + 1):
            if self.namespace(i) not in existing:
                _ip("netns", "add", self.namespace(i))
            self._wire(i)
        return [self.address(i) for i in range(1, n + 1)]

    def _wire(self, i: int) -> None:
        """Namespace i's veth pair, address and links up (lo too: a process may talk to itself on 127.0.0.1)."""
        ns = self.namespace(i)
        if not _exists(self.veth(i)):
            _ip("link", "add", self.veth(i), "type", "veth", "peer", "name", INNER_INTERFACE, "netns", ns)
        _ip("link", "set", self.veth(i), "master", self.bridge, "up")
        if f"{self.address(i)}/" not in _ip("-n", ns, "-4", "addr", "show", "dev", INNER_INTERFACE):
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/{PREFIX_LEN}", "dev", INNER_INTERFACE)
        self.set_link(i, up=True)
        _ip("-n", ns, "link", "set", "lo", "up")

    def set_link(self, i: int, up: bool) -> None:
        """Takes namespace i's interface down (a cable pulled: nothing in or out, addresses kept) or up again."""
        _ip("-n", self.namespace(i), "link", "set", INNER_INTERFACE, "up" if up else "down")

    def link(self, i: int) -> str:
        """`ip -br link` of namespace i's interface (name, UP or DOWN, ...), or "" without the namespace."""
        return _ip("-n", self.namespace(i), "-br", "link", "show", INNER_INTERFACE, check=False).strip()

    def down(self) -> None:
        """Removes this network's namespaces (their veth pairs go with them, and any process still in one is
        killed: the namespace would outlive its name), its names and the bridge; a no-op when absent."""
        _require()
        for ns in self.namespaces():
            for pid in _ip("netns", "pids", ns, check=False).split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "delete", ns)
        for i in range(1, MAX_NAMESPACES + 1):  # a veth whose namespace was deleted by hand may linger briefly
            if _exists(self.veth(i)):
                _ip("link", "delete", self.veth(i), check=False)
        self.unpublish_names()
        if _exists(self.bridge):
            _ip("link", "delete", self.bridge)

    def publish_names(self, n: int, extra: dict[str, str]) -> None:
        """Makes namespace names 1..n (and `extra`, name -> address) resolve: inside each namespace through
        /etc/netns/<ns>/hosts (for what `run_in`, or `ip netns exec`, starts afterwards), and on the host
        through lines of /etc/hosts marked as this network's. Idempotent; `down` takes them back."""
        names = {self.namespace(i): self.address(i) for i in range(1, n + 1)} | extra
        inside = "127.0.0.1 localhost\n" + "".join(f"{address} {name}\n" for name, address in names.items())
        for i in range(1, n + 1):
            (NETNS_ETC / self.namespace(i)).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / self.namespace(i) / "hosts").write_text(inside)
        ours = [f"{self.address(i)} {self.namespace(i)} {self._mark}" for i in range(1, n + 1)]
        _rewrite_hosts(self._mark, ours)

    def unpublish_names(self) -> None:
        for i in range(1, MAX_NAMESPACES + 1):
            shutil.rmtree(NETNS_ETC / self.namespace(i), ignore_errors=True)
        with contextlib.suppress(OSError):  # /etc/netns itself, if publish_names made it and nothing else is in it
            NETNS_ETC.rmdir()
        _rewrite_hosts(self._mark, [])

    @property
    def _mark(self) -> str:
        # the module's name before launch/testslurm/, kept: /etc/hosts lines written then are still found
        return f"# launch.netns {self.bridge}"

    def read_counters(self, i: int) -> tuple[int, int]:
        """(rx_bytes, tx_bytes) of namespace i as the namespace sees them: (bytes it received, bytes it sent).

        Read on the host side of the veth pair, where the directions are swapped: what the host side transmits
        the namespace receives."""
        stats = f"/sys/class/net/{self.veth(i)}/statistics"
        if not os.path.isdir(stats):
            raise NetnsUnavailable(f"no interface {self.veth(i)}: is namespace {self.namespace(i)} up?")
        with open(f"{stats}/tx_bytes") as tx, open(f"{stats}/rx_bytes") as rx:
            return int(tx.read()), int(rx.read())

    def run_in(self, i: int, argv: list[str], env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.Popen:
        """Starts `argv` inside namespace i (`ip netns exec`, which keeps the environment); returns the process."""
        _require()
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(i), *argv], env=env, **popen_kwargs)


def _rewrite_hosts(mark: str, lines: list[str]) -> None:
    """/etc/hosts without the lines ending in `mark`, plus `lines`; untouched when that changes nothing.

    Written in place: in a container /etc/hosts is often a bind mount, which a rename cannot replace."""
    old = HOSTS.read_text() if HOSTS.exists() else ""
    kept = [line for line in old.splitlines() if not line.endswith(mark)]
    new = "".join(f"{line}\n" for line in kept + lines)
    if new != old:
        with open(HOSTS, "r+" if HOSTS.exists() else "w") as f:
            f.write(new)  # the kept lines come first, as before: a reader never misses localhost
            f.truncate()


WIRE = Network(bridge="br-tf", subnet="10.78.0", prefix="tfnode", veth_prefix="vtf")
namespace, address, veth, namespaces = WIRE.namespace, WIRE.address, WIRE.veth, WIRE.namespaces
up, down, read_counters, run_in = WIRE.up, WIRE.down, WIRE.read_counters, WIRE.run_in


def main(argv: list[str]) -> int:
    usage = "usage: python -m launch.testslurm.netns up N | down | status"
    try:
        if argv[:1] == ["up"] and len(argv) == 2 and argv[1].isdigit():
            print(" ".join(f"{namespace(i + 1)}={a}" for i, a in enumerate(up(int(argv[1])))))
        elif argv == ["down"]:
            down()
        elif argv == ["status"]:
            for ns in namespaces():
                i = WIRE.index(ns)
                received, sent = read_counters(i)
                print(f"{ns} {address(i)} {veth(i)} received {received} B, sent {sent} B")
        else:
            print(usage, file=sys.stderr)
            return 2
    except NetnsUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
