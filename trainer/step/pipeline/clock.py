"""When a pipeline's events ran: the in-graph clock of a timed step (`Clock`), and the bubble measured from it
(`bubble_of`), which `metrics.json` reports."""

from __future__ import annotations

import tensorflow as tf

from trainer.step.core import micro_batch as mb


def bubble_of(names: list[str], events, num_stages: int, num_pipelines: int):
    """(seconds each device's events ran, the measured bubble) of a timed step's `events` ([start, end] per
    event, named as `PipelineRunner.event_names`), or (None, None) without them. A device's bubble is the
    share of its pipeline's span (first start to last end of any of its stages) in which it ran nothing, an
    event counting from when its inputs were there; the measured bubble is the mean over devices.

    The clocks are host callbacks, which run late when the inter-op threads are busy: an event is cut at the
    start of the next event of its device (which a control dependency holds until it ended), so a device is
    never busy longer than its span.
    """
    if not events:
        return None, None
    per_pipeline = len(names) // num_pipelines
    by_device, spans = {}, {}
    for index, (name, (start, end)) in enumerate(zip(names, events, strict=True)):
        pipeline, stage = index // per_pipeline, int(name.split(":")[0])
        by_device.setdefault(pipeline * num_stages + stage, []).append((start, end))  # in the device's order
        lo, hi = spans.get(pipeline, (start, end))
        spans[pipeline] = (min(lo, start), max(hi, end))
    busy = {}
    for device, runs in by_device.items():
        ends = [min(end, after[0]) for (_, end), after in zip(runs, runs[1:], strict=False)] + [runs[-1][1]]
        busy[device] = sum(max(0.0, end - start) for (start, _), end in zip(runs, ends, strict=True))
    bubbles = [1.0 - busy[d] / (spans[d // num_stages][1] - spans[d // num_stages][0]) for d in sorted(busy)]
    return [busy[d] for d in sorted(busy)], sum(bubbles) / len(bubbles)


class Clock:
    """In-graph timestamps of each event: two host callbacks per event when `timed` (a bool, or a bool tensor
    for a step traced once for timed and untimed calls: 0s when false); none at all for the bool False
    (`mb.clocked`)."""

    def __init__(self, timed, anchor):
        self.timed, self.anchor, self.first, self.last = timed, anchor, {}, {}
        self.clocked = mb.clocked(timed)
        self.events = []  # [start, end] of every event, in build order (`PipelineRunner.event_names`)
        self._open = None

    def start(self, device: str, waits: list):
        """The event's start: once its device is free and its inputs are there."""
        if not self.clocked:
            return None
        with tf.control_dependencies(waits):
            self._open = mb.now(self.anchor, self.timed)
        self.first.setdefault(device, self._open)
        return self._open

    def end(self, device: str, done) -> None:
        if not self.clocked:
            return
        with tf.control_dependencies([done]):
            self.last[device] = mb.now(self.anchor, self.timed)
        self.events.append(tf.stack([self._open, self.last[device]]))

    def totals(self, towers) -> dict:
        if not self.clocked:
            return {}
        return {
            "tower_step_sec": tf.stack([self.last[d] - self.first[d] for d in towers]),
            "event_sec": tf.stack(self.events),
        }
