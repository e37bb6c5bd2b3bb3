"""The session-wide local Slurm (launch/testslurm/local_slurm.py) for the tests marked `slurm`.

tests/conftest.py imports `local_slurm` from here. Loaded as a plugin instead (`pytest -p tests.support.slurm_fixture`
or `pytest_plugins = ["tests.support.slurm_fixture"]`), this module also registers the `slurm` marker.
With TOWERFLOW_REQUIRE_SLURM=1 (for CI), a Slurm that cannot be brought up fails the tests instead of skipping them.
"""

import os

import pytest

from launch.testslurm import local_slurm as slurm_lib
from launch.testslurm import slurm_daemons


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slurm: needs the local Slurm that tests/support/slurm_fixture.py brings up (root)"
    )


def start_or_skip(up, what: str):
    """`up()` after installing Slurm if needed; skips the test where it cannot (fails with
    TOWERFLOW_REQUIRE_SLURM=1)."""
    try:
        slurm_daemons.install()
        return up()
    except slurm_daemons.SlurmUnavailable as e:
        if os.environ.get("TOWERFLOW_REQUIRE_SLURM") == "1":
            raise
        pytest.skip(f"no {what}: {e}")


def session_slurm(up, down, what: str):
    """For a session fixture: yields `start_or_skip(up)`; afterwards `down()`, only if `up()` started something."""
    slurm = start_or_skip(up, what)
    yield slurm
    if slurm.started_here:
        down()


@pytest.fixture(scope="session")
def local_slurm():
    """Installs and starts (or reuses) the local Slurm; skips where it cannot; stops it only if it started it."""
    yield from session_slurm(slurm_lib.up, slurm_lib.down, "local Slurm")
