"""Free TCP ports on 127.0.0.1, for the tasks of a run started as local processes: by the tests and by the
benchmarks (benchmarks/machines/), which both import it from here."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """`count` distinct ports the kernel handed out, all bound at once and then released."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports
