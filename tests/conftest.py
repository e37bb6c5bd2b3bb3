"""Shared test setup: 4 logical CPU devices stand in for GPUs, a per-session digits cache (per xdist worker),
the tests marked slurm or twonode kept on one xdist worker, and so are the tests of a module that share a module
fixture (xdist hands out the groups with the most tests first).

Logical devices can only be configured before TensorFlow initialises its devices, so this happens once,
when pytest loads this file, before any test module runs an op.
"""

import dataclasses
import gc
import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import pytest  # noqa: E402

from tests.support.node_fixture import node_slurm, three_node_slurm, two_node_slurm  # noqa: E402, F401 (tests marked twonode)
from tests.support.slurm_fixture import local_slurm  # noqa: E402, F401 (the session's local Slurm, for tests marked slurm)

NUM_LOGICAL_DEVICES = 4


def pytest_configure(config):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_DEVICES)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 3`, with setup.cfg's `--dist loadgroup`), every test marked slurm or twonode runs
    on one worker: the slurm ones share the one local Slurm the session fixture `local_slurm` brings up and takes
    down, and jobs on either Slurm take both cores for up to minutes, which tests timing Slurm's signals do not
    survive beside each other.

    xdist groups a test by a suffix it writes into the test's node id, after this marking. pytest 9.2 reads
    node ids from elsewhere, so there (xdist 3.8) the suffix is lost and the groups are silently ignored: the
    Slurm tests then ran on both workers at once and failed by chance. Each such test now fails saying so."""
    for item in items:
        if item.get_closest_marker("slurm") or item.get_closest_marker("twonode"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif not item.get_closest_marker("xdist_group") and _uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    result = yield
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                item.add_marker(pytest.mark.ungrouped)
    return result


def _uses_a_module_fixture(item) -> bool:
    """Whether the test uses a fixture computed once per module (a run several tests read; the config factory
    `make_module_config` aside). Its module's tests are then one xdist group: spread over both workers, each
    worker would compute it (the served-equals-evaluated runs, 52 s of setup, were trained twice)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info else {}
    return any(
        fixture.scope == "module" and name != "make_module_config"
        for name in item.fixturenames
        for fixture in defs.get(name, ())
    )


def pytest_collection_finish(session):
    """Moves every object alive once the test modules are imported (TensorFlow's, Keras's, the trainer's:
    ~370 000) out of the garbage collector's reach for the session: each full collection walked them all,
    0.6 s on an idle core and 1-2 s beside other work, and a session runs hundreds of them (test_training.py
    alone: 7 full collections, 9.1 s; frozen: 14, 3.4 s). What is frozen is module state that lives to the
    end anyway; garbage made from here on is collected as before."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Collects a test module's garbage after its last test in this process, fixtures torn down, while none of
    its threads runs, so a module's leftovers (models, streams, thread pools) are not deleted inside another
    module's test.

    Such a deletion once stalled whatever ran next: a tf.data iterator made with tf.data's autotuning model
    waits out the model thread's sleep when deleted (docs/facts.md), and the collector deleted the tests'
    training streams inside later tests, in whatever thread allocated then, holding the GIL: gen-2 collections
    of 2.5-82 s with no CPU used, and once an async test's tower thread stuck for minutes under `-n 3`. Every
    dataset the engine iterates now runs without the model (`data.options`); under `-n 3` trainer/step's tests
    spent 46 s in gen-2 collections with a collection after every test, 31 s with one per module, at most 1.6 s
    in any."""
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.module is not item.module:
            gc.collect()


def pytest_runtest_setup(item):
    if item.get_closest_marker("ungrouped"):
        pytest.fail(
            f"pytest {pytest.__version__} with this pytest-xdist ignores xdist_group: this test would run beside "
            "the other Slurm tests; install the versions setup.cfg's [test] extra names",
            pytrace=False,
        )


@pytest.fixture(scope="session", autouse=True)
def digits_cache(tmp_path_factory):
    """One digits cache per test session, never the user's ~/.cache."""
    path = tmp_path_factory.mktemp("cache")
    previous = os.environ.get("TOWERFLOW_CACHE")
    os.environ["TOWERFLOW_CACHE"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("TOWERFLOW_CACHE", None)
    else:
        os.environ["TOWERFLOW_CACHE"] = previous


@pytest.fixture
def make_config(tmp_path):
    """Returns a factory of small, fast RunConfigs on logical CPU towers; keyword groups override fields."""
    return _config_factory(tmp_path)


@pytest.fixture(scope="module")
def make_module_config(tmp_path_factory):
    """`make_config` for a module-scoped fixture (a run several tests compare against)."""
    return _config_factory(tmp_path_factory.mktemp("module_config"))


def _config_factory(tmp_path):
    from trainer.settings import config as cfg

    def make(model_dir=None, seed=0, deterministic=True, **groups):
        base = cfg.RunConfig(
            towers=cfg.TowerConfig(num_towers=2, device="cpu", parameter_device="cpu", global_batch_size=64),
            loop=cfg.LoopConfig(
                model_dir=str(model_dir or tmp_path / "run"),
                train_steps=20,
                log_every_steps=10,
                eval_every_steps=0,
                checkpoint_every_steps=0,
                histogram_every_steps=0,
                export=False,
            ),
            seed=seed,
            deterministic=deterministic,
        )
        if isinstance(groups.get("data", {}).get("normalize"), str):  # the flag's text, parsed as the flag is
            groups["data"] = {**groups["data"], "normalize": cfg.Normalization.parse(groups["data"]["normalize"])}
        replaced = {name: dataclasses.replace(getattr(base, name), **values) for name, values in groups.items()}
        return dataclasses.replace(base, **replaced)

    return make


@pytest.fixture(autouse=True)
def no_stop_signal_left_behind():
    """Fails the test that leaves the process-wide stop request holding a signal or installed (importing
    `trainer.__main__` installs it), and undoes that: otherwise every later run in this test process stops
    "before the model was built" (a cascade of 12 failures once, far from its cause)."""
    from trainer.system import stop  # noqa: PLC0415 (no TensorFlow; imported late like the trainer elsewhere)

    yield
    signals = list(stop.REQUEST.signals)
    installed = [s for s in stop.STOP_SIGNALS if signal.getsignal(s) == stop.REQUEST.handle]
    stop.REQUEST.uninstall()
    stop.REQUEST.clear()
    if signals or installed:
        pytest.fail(f"the test left the stop request with signals {signals}, handlers installed for {installed}")
