"""`--profile_steps`: the trace holds one step marker per step, which the Profile tab's overview and
input-pipeline pages need ("No step marker observed" otherwise)."""

import glob

from tensorflow.tsl.profiler.protobuf import xplane_pb2

from trainer.loop.run import train


def _step_markers(path: str) -> list[int]:
    """The step numbers of the `train` step markers on the host plane of an xplane.pb."""
    with open(path, "rb") as f:
        space = xplane_pb2.XSpace.FromString(f.read())
    steps = []
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        stat_names = {k: m.name for k, m in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if names.get(event.metadata_id) != "train":
                    continue
                steps += [
                    s.int64_value or s.uint64_value for s in event.stats if stat_names[s.metadata_id] == "step_num"
                ]
    return sorted(steps)


def test_profiled_steps_carry_step_markers_numbered_by_global_step(make_config, tmp_path):
    train(make_config(loop={"train_steps": 2, "checkpoint_every_steps": 2}))
    train(make_config(loop={"train_steps": 10, "log_every_steps": 5, "profile_steps": (3, 7)}))  # resumed at 2
    traces = glob.glob(str(tmp_path / "run" / "train" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(traces) == 1
    markers = _step_markers(traces[0])
    assert markers == [4, 5, 6, 7]  # steps A+1..B of --profile_steps=A,B, one marker each
