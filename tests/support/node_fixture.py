"""The session's N-node Slurm (launch/testslurm/node_slurm.py) for the tests marked `twonode` (two nodes or more).

tests/conftest.py imports the fixtures from here, and puts the `twonode` tests on the xdist worker of the `slurm`
ones, so that they never run beside each other on the 2 cores. `node_slurm(count)` brings up (or reuses) the
Slurm with that many nodes; `two_node_slurm` and `three_node_slurm` are it with 2 and 3. A count other than the
running one restarts the daemons (a few seconds), so a module keeps to one count. Loaded as a plugin instead
(`pytest -p tests.support.node_fixture`), this module also registers the `twonode` marker. With
TOWERFLOW_REQUIRE_SLURM=1 (for CI), a Slurm that cannot be brought up fails the tests instead of skipping them.
"""

import pytest

from launch.testslurm import node_slurm as node_lib
from tests.support.slurm_fixture import start_or_skip


def pytest_configure(config):
    config.addinivalue_line("markers", "twonode: needs the N-node Slurm that tests/support/node_fixture.py brings up")


@pytest.fixture(scope="session")
def node_slurm():
    """`node_slurm(count, cred_expire_sec=...)`: the Slurm of `count` nodes (node_lib.up), or the test skipped
    where it cannot run. Taken down (namespaces and host names too) at the end of the session if any call
    started a daemon."""
    started = []

    def up(count: int = node_lib.DEFAULT_NODES, **kwargs) -> node_lib.NodeSlurm:
        slurm = start_or_skip(lambda: node_lib.up(count, **kwargs), f"{count}-node Slurm")
        started.append(slurm.started_here)
        return slurm

    yield up
    if any(started):
        node_lib.down()


@pytest.fixture
def two_node_slurm(node_slurm):
    """The N-node Slurm with two nodes, tfn1 and tfn2."""
    return node_slurm(2)


@pytest.fixture
def three_node_slurm(node_slurm):
    """The N-node Slurm with three nodes, tfn1 to tfn3."""
    return node_slurm(3)
