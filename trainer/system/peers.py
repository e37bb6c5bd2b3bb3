"""Whether the other tasks of a run are alive, by one rule for every task: the chief watches its workers, a
worker watches its chief.

A peer is alive when its TensorFlow server answers: a new TCP connection to its port gets HTTP/2's SETTINGS
frame back within `PROBE_TIMEOUT_SEC`. An open port is not enough: the kernel completes the handshake for a
frozen process (SIGSTOP, a hung driver, a node swapping), which then never answers. Three outcomes of a probe:

- ANSWERED: alive.
- REFUSED: the peer's host answered, but nothing listens on the port: its process is gone (killed, crashed or
  ended). `REFUSED_PROBES` in a row end the attempt at once.
- UNREACHABLE or MUTE: no answer: the network is cut or the host down (the connection does not open), or
  the process is frozen (it opens, nothing answers). A network blip shorter than the timeout costs only its
  duration (gRPC carries the step on once packets flow again).

A peer not ANSWERED for `timeout_sec` is lost: `on_lost(message)` runs (the message names the task, its
address and how long it was silent), then the process exits with 75 (resumable), so that every task of the
run ends within the timeout plus a probe, whatever ended the first one.
"""

from __future__ import annotations

import enum
import os
import socket
import sys
import threading
import time

from trainer.system import stop as stop_lib

PROBE_EVERY_SEC = 1.0
PROBE_TIMEOUT_SEC = 2.0
REFUSED_PROBES = 3
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS
HTTP2_SETTINGS = 4


class Probe(enum.Enum):
    ANSWERED = "answered"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"  # the connection did not open: a cut network, a host down
    MUTE = "mute"  # the connection opened, nothing answered: a frozen process (or a program that never reads)
    NOT_GRPC = "not gRPC"  # something answered, but not as a gRPC server: another program holds the port


def probe(address: str, timeout: float = PROBE_TIMEOUT_SEC) -> Probe:
    """How the server at "host:port" answers HTTP/2's connection preface within `timeout` seconds."""
    host, _, port = address.rpartition(":")
    try:
        connection = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except ConnectionRefusedError:
        return Probe.REFUSED
    except OSError:  # a timeout, an unreachable network or host
        return Probe.UNREACHABLE
    with connection:
        try:
            connection.settimeout(timeout)
            connection.sendall(HTTP2_PREFACE)
            frame = connection.recv(9)
        except TimeoutError:
            return Probe.MUTE
        except OSError:  # a reset: a program that hung up on us
            return Probe.NOT_GRPC
    if len(frame) >= 4 and frame[3] == HTTP2_SETTINGS:
        return Probe.ANSWERED
    return Probe.NOT_GRPC


class Watch:
    """A daemon thread running `self._run` from `with watch:` on; leaving the block sets `self._stopped`,
    which `_run` waits on between its checks."""

    def __init__(self, name: str):
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()

    def _run(self) -> None:
        raise NotImplementedError


class PeerWatch(Watch):
    """Probes `peers` ({task index: "host:port"}) from a thread; ends the process with 75 when one is lost.

    Args:
      peers: the tasks to watch.
      describe: task index -> how messages name it, e.g. "worker task 1 (node2:12001)".
      timeout_sec: how long a peer may go without answering (--peer_timeout_sec).
      on_lost: called with the message before the exit (to record the attempt's end); its errors are ignored.
    """

    def __init__(self, peers: dict[int, str], describe, timeout_sec: float, on_lost=None, every=PROBE_EVERY_SEC):
        self.peers, self.describe, self.timeout_sec = peers, describe, timeout_sec
        self.on_lost = on_lost or (lambda message: None)
        self.every = every
        self._answered = dict.fromkeys(peers, time.monotonic())  # when each peer last answered
        super().__init__("towerflow-peer-watch")

    def silent(self) -> list[int]:
        """The peers that missed their latest probe (any thread): this watch is timing them."""
        now, missed = time.monotonic(), self.every + PROBE_TIMEOUT_SEC + 1.0
        return [task for task, when in self._answered.items() if now - when > missed]

    def _run(self) -> None:
        answered = self._answered
        refused = dict.fromkeys(self.peers, 0)
        while not self._stopped.wait(self.every):
            for task, address in self.peers.items():
                outcome = probe(address, min(PROBE_TIMEOUT_SEC, self.timeout_sec))
                now = time.monotonic()
                if outcome is Probe.ANSWERED:
                    answered[task], refused[task] = now, 0
                    continue
                refused[task] = refused[task] + 1 if outcome is Probe.REFUSED else 0
                if self._stopped.is_set():
                    return
                if refused[task] >= REFUSED_PROBES:
                    self._lose(f"{self.describe(task)} is gone: nothing listens at {address} any more")
                elif now - answered[task] > self.timeout_sec:
                    self._lose(
                        f"{self.describe(task)} has not answered for {now - answered[task]:.0f} s (--peer_timeout_sec="
                        f"{self.timeout_sec:g}): its machine is unreachable or its process frozen"
                    )

    def _lose(self, what: str) -> None:
        end_attempt(what, self.on_lost)


def end_attempt(what: str, on_lost) -> None:
    """Ends the process with 75 (resumable) at once, whatever its threads are doing: prints `what` as the error,
    then calls `on_lost(message)` (to record the attempt's end; its errors are ignored)."""
    message = f"{what}; ending this attempt with {stop_lib.EXIT_RESUMABLE} (the last checkpoint is kept)"
    print(f"error: {message}", file=sys.stderr, flush=True)
    try:
        on_lost(message)
    except Exception as e:  # noqa: BLE001 - the exit must happen whatever the record does
        print(f"warning: could not record the loss: {e}", file=sys.stderr, flush=True)
    finally:
        os._exit(stop_lib.EXIT_RESUMABLE)
