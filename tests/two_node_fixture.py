"""The session-wide two-node Slurm (launch/two_node_slurm.py) for the tests marked `twonode`.

tests/conftest.py imports `two_node_slurm` from here, and puts the `twonode` tests on the xdist worker of the
`slurm` ones, so that they never run beside each other on the 2 cores. Loaded as a plugin instead (`pytest -p
tests.two_node_fixture`), this module also registers the `twonode` marker. With TOWERFLOW_REQUIRE_SLURM=1 (for
CI), a Slurm that cannot be brought up fails the tests instead of skipping them.
"""

import pytest

from launch import two_node_slurm as two_node_lib
from tests.slurm_fixture import session_slurm


def pytest_configure(config):
    config.addinivalue_line("markers", "twonode: needs the two-node Slurm that tests/two_node_fixture.py brings up")


@pytest.fixture(scope="session")
def two_node_slurm():
    """Installs and starts (or reuses) the two-node Slurm; skips where it cannot; takes it down (namespaces and
    host names too) only if it started it."""
    yield from session_slurm(two_node_lib.up, two_node_lib.down, "two-node Slurm")
