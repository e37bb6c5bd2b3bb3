"""Network namespaces as stand-in machines, so each task of a multi-task run has its own network interface:
`python -m launch.netns up N | down | status`.

Processes on 127.0.0.1 share `lo`, whose byte counter merges every task's traffic. Here task i runs in the
namespace `tfnode<i>` (i = 1..N) behind a veth pair: `eth0` inside with address 10.78.0.(10 + i)/24, the host
side `vtf<i>` on the bridge `br-tf` (10.78.0.1/24). Every byte a namespace sends or receives crosses its
veth, so the kernel's counters of the host side give that task's traffic alone (`read_counters`: host-side
rx = bytes the namespace sent). Names and the subnet stay clear of the two-node Slurm fixture (br-2n,
10.77.0.0/24, namespaces node1, node2). Needs root and iproute2's `ip`; stdlib only, no TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

BRIDGE = "br-tf"
SUBNET = "10.78.0"
HOST_ADDRESS = f"{SUBNET}.1"
PREFIX_LEN = 24
NAMESPACE = "tfnode"  # tfnode1, tfnode2, ...
INNER_INTERFACE = "eth0"
MAX_NAMESPACES = 200  # addresses .11 .. .210


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no `ip`, or `ip` failed); the message says why."""


def namespace(i: int) -> str:
    return f"{NAMESPACE}{i}"


def address(i: int) -> str:
    """The IPv4 address of namespace i (1-based) on the bridge."""
    return f"{SUBNET}.{10 + i}"


def veth(i: int) -> str:
    """The host side of namespace i's veth pair, on the bridge."""
    return f"vtf{i}"


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


def namespaces() -> list[str]:
    """The tfnode<i> namespaces that exist now."""
    names = (line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip())
    ours = [n for n in names if n.startswith(NAMESPACE) and n[len(NAMESPACE) :].isdigit()]
    return sorted(ours, key=lambda n: int(n[len(NAMESPACE) :]))


def up(n: int) -> list[str]:
    """Makes the bridge and namespaces 1..n (what exists already is kept); returns their addresses."""
    _require()
    if not 1 <= n <= MAX_NAMESPACES:
        raise ValueError(f"between 1 and {MAX_NAMESPACES} namespaces, not {n}")
    if not _exists(BRIDGE):
        _ip("link", "add", BRIDGE, "type", "bridge")
    if f"{HOST_ADDRESS}/" not in _ip("-4", "addr", "show", "dev", BRIDGE):
        _ip("addr", "add", f"{HOST_ADDRESS}/{PREFIX_LEN}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    existing = set(namespaces())
    for i in range(1, n + 1):
        if namespace(i) not in existing:
            _ip("netns", "add", namespace(i))
        _wire(i)
    return [address(i) for i in range(1, n + 1)]


def _wire(i: int) -> None:
    """Namespace i's veth pair, address and links up (lo too: a process may talk to itself on 127.0.0.1)."""
    ns = namespace(i)
    if not _exists(veth(i)):
        _ip("link", "add", veth(i), "type", "veth", "peer", "name", INNER_INTERFACE, "netns", ns)
    _ip("link", "set", veth(i), "master", BRIDGE, "up")
    inside = ("netns", "exec", ns, "ip")
    if f"{address(i)}/" not in _ip(*inside, "-4", "addr", "show", "dev", INNER_INTERFACE):
        _ip(*inside, "addr", "add", f"{address(i)}/{PREFIX_LEN}", "dev", INNER_INTERFACE)
    _ip(*inside, "link", "set", INNER_INTERFACE, "up")
    _ip(*inside, "link", "set", "lo", "up")


def down() -> None:
    """Removes every tfnode<i> namespace (their veth pairs go with them) and the bridge; a no-op when absent."""
    _require()
    for ns in namespaces():
        _ip("netns", "delete", ns)
    for i in range(1, MAX_NAMESPACES + 1):  # a veth whose namespace was deleted by hand may linger briefly
        if _exists(veth(i)):
            _ip("link", "delete", veth(i), check=False)
    if _exists(BRIDGE):
        _ip("link", "delete", BRIDGE)


def read_counters(i: int) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of namespace i as the namespace sees them: (bytes it received, bytes it sent).

    Read on the host side of the veth pair, where the directions are swapped: what the host side transmits
    the namespace receives."""
    stats = f"/sys/class/net/{veth(i)}/statistics"
    if not os.path.isdir(stats):
        raise NetnsUnavailable(f"no interface {veth(i)}: is namespace {namespace(i)} up (launch.netns.up)?")
    with open(f"{stats}/tx_bytes") as tx, open(f"{stats}/rx_bytes") as rx:
        return int(tx.read()), int(rx.read())


def run_in(i: int, argv: list[str], env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.Popen:
    """Starts `argv` inside namespace i (`ip netns exec`, which keeps the environment); returns the process."""
    _require()
    return subprocess.Popen(["ip", "netns", "exec", namespace(i), *argv], env=env, **popen_kwargs)


def main(argv: list[str]) -> int:
    usage = "usage: python -m launch.netns up N | down | status"
    try:
        if argv[:1] == ["up"] and len(argv) == 2 and argv[1].isdigit():
            print(" ".join(f"{namespace(i + 1)}={a}" for i, a in enumerate(up(int(argv[1])))))
        elif argv == ["down"]:
            down()
        elif argv == ["status"]:
            for ns in namespaces():
                i = int(ns[len(NAMESPACE) :])
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
