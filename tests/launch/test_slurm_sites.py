"""The one-node and the N-node test Slurms keep apart on one machine (launch/testslurm/: slurm_conf.py,
slurm_daemons.py, netns.py): their configs, ports, job ids and networks differ, and another Slurm is in the way
only when it uses one of a site's ports. No Slurm, no root needed."""

import pytest

from launch.testslurm import local_slurm, netns, node_slurm, slurm_conf, slurm_daemons

pytestmark = pytest.mark.quick

MACHINE = slurm_conf.Machine("vm", "CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1", 1000, 2)


def _lines(text: str, *keys: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {key: value for key, value in pairs if key in keys}


def test_the_two_sites_share_no_port_directory_cluster_name_or_job_id():
    one, _ = slurm_conf.render(local_slurm.SITE, MACHINE, {"vm": "127.0.0.1"})
    two, _ = slurm_conf.render(node_slurm.SITE, MACHINE, {"tfn1": "10.79.0.11", "tfn2": "10.79.0.12"})
    keys = ("ClusterName", "SlurmctldPort", "SlurmdPort", "FirstJobId", "StateSaveLocation", "SlurmctldPidFile")
    mine, theirs = _lines(one, *keys), _lines(two, *keys)
    assert len(mine) == len(theirs) == len(keys)
    assert all(mine[key] != theirs[key] for key in keys), (mine, theirs)
    assert "SlurmctldHost=vm(10.79.0.1)" in two and "NodeName=tfn2 NodeAddr=10.79.0.12 CPUs=2 " in two
    assert "ProctrackType=proctrack/linuxproc" in two  # two slurmd on one cgroup tree
    assert f"SlurmdSpoolDir={node_slurm.ROOT}/spool/%n" in two  # one spool per node


def test_cred_expire_is_the_short_hold_unless_slurms_default_is_asked_for():
    short, _ = slurm_conf.render(node_slurm.SITE, MACHINE, {"tfn1": "10.79.0.11"})
    default, _ = slurm_conf.render(node_slurm.SITE, MACHINE, {"tfn1": "10.79.0.11"}, cred_expire_sec=None)
    assert f"AuthInfo=cred_expire={slurm_conf.CRED_EXPIRE_SEC}\n" in short
    assert "AuthInfo" not in default and "SchedulerParameters=sched_interval=1" in default


def test_another_slurm_is_in_the_way_only_on_one_of_our_ports(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldPort=7817\nslurmdport = 7818\n")
    assert slurm_daemons._ports_of(conf) == {7817, 7818}
    assert slurm_daemons._ports_of(tmp_path / "missing.conf") == set(slurm_conf.DEFAULT_PORTS)
    assert not set(node_slurm.SITE.ports) & set(local_slurm.SITE.ports)


def test_the_node_network_and_the_wire_network_never_claim_each_others_namespaces():
    two, wire = node_slurm.NET, netns.WIRE
    assert [two.index(n) for n in ("tfn1", "tfn3", "tfnode1", "tfn")] == [1, 3, 0, 0]
    assert [wire.index(n) for n in ("tfnode3", "tfn1")] == [3, 0]
    assert {two.bridge, two.veth(1), two.address(1)}.isdisjoint({wire.bridge, wire.veth(1), wire.address(1)})
    assert node_slurm.node_names(3) == ("tfn1", "tfn2", "tfn3") and netns.namespace(1) == "tfnode1"
    assert {two.veth(i) for i in range(1, 201)}.isdisjoint({wire.veth(i) for i in range(1, 201)})
