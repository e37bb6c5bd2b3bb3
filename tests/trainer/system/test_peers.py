"""How a probe tells a live TensorFlow server from a frozen one, a gone one and a stranger on its port
(trainer.system.peers), against small socket servers standing in for each. The tasks themselves, frozen and
killed: tests/trainer/system/test_multinode.py."""

import contextlib
import errno
import socket
import threading

import pytest

from trainer.system import peers


@contextlib.contextmanager
def _server(reply: bytes | None, accept: bool = True):
    """A listening socket on 127.0.0.1; with `accept`, it reads the client's bytes and sends `reply`."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def answer():
        with contextlib.suppress(OSError):
            connection, _ = listener.accept()
            with connection:
                connection.recv(64)
                if reply:
                    connection.sendall(reply)

    if accept:
        threading.Thread(target=answer, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


SETTINGS = bytes([0, 0, 6, peers.HTTP2_SETTINGS, 0, 0, 0, 0, 0]) + bytes(6)  # what a gRPC server sends first


@pytest.mark.quick
def test_a_grpc_server_answers():
    with _server(SETTINGS) as address:
        assert peers.probe(address, 2.0) is peers.Probe.ANSWERED


@pytest.mark.quick
def test_a_frozen_process_is_mute_though_its_port_is_open():
    with _server(None, accept=False) as address:  # the kernel completes the handshake, nobody reads
        assert peers.probe(address, 0.5) is peers.Probe.MUTE


@pytest.mark.quick
def test_a_closed_port_is_refused():
    with _server(None, accept=False) as address:
        pass
    assert peers.probe(address, 0.5) is peers.Probe.REFUSED


@pytest.mark.quick
def test_another_program_on_the_port_is_not_grpc():
    with _server(b"HTTP/1.1 400 Bad Request\r\n\r\n") as address:
        assert peers.probe(address, 2.0) is peers.Probe.NOT_GRPC


@pytest.mark.quick
@pytest.mark.parametrize("error", [TimeoutError("timed out"), OSError(errno.ENETUNREACH, "Network is unreachable")])
def test_a_connection_that_does_not_open_is_unreachable(monkeypatch, error):
    """A cut network: the SYN goes unanswered (a timeout) or there is no route. Simulated: whether an address
    times out or is refused depends on the machine's network."""

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(socket, "create_connection", fail)
    assert peers.probe("node2:12000", 0.5) is peers.Probe.UNREACHABLE
