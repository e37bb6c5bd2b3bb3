"""A chief's port held by another program: the chief exits 2 at once with one line naming the port, and its
worker, which cannot tell a failed chief from a slow one by waiting, sees that the port does not answer as a
gRPC server and exits 2 too, instead of waiting --cluster_timeout_sec (60 s here)."""

import socket
import time

from tests.support.cluster import Job, tf_config_envs


def test_a_taken_chief_port_fails_both_tasks_at_once(tmp_path):
    envs = tf_config_envs(2)
    port = int(envs[0]["TF_CONFIG"].split("127.0.0.1:")[1].split('"')[0])
    held = socket.socket()
    held.bind(("127.0.0.1", port))
    held.listen(8)
    try:
        started = time.monotonic()
        job = Job(tmp_path / "run", envs, 1, "--train_steps=3")
        assert job.wait(timeout=50) == [2, 2]
        elapsed = time.monotonic() - started
    finally:
        held.close()
    chief = job.output(0).strip().splitlines()
    assert len(chief) == 1 and chief[0].startswith(f"error: port {port} of task 0 (the chief at 127.0.0.1:{port}")
    worker = job.output(1).strip().splitlines()
    assert worker[-1].startswith(f"error: the chief's port (127.0.0.1:{port}) is held by a program that is not")
    assert "Traceback" not in job.output(1)
    assert elapsed < 30, elapsed  # TensorFlow's import and one probe; --cluster_timeout_sec is 60
    assert not (tmp_path / "run").exists()
