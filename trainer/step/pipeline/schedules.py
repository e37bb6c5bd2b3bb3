"""Pipeline schedules: the order in which each stage runs its micro-batches' forward and backward passes.

S stages, m micro-batches per pipeline. A schedule gives each stage a sequence of events ("F", j) / ("B", j);
`trainer.step.pipeline.runner` chains every stage's events with control dependencies, so the order below is the
order that runs, not the one the executor happens to pick.

- `gpipe` (fill-drain, GPipe): every forward, then every backward (the last micro-batch first). A stage keeps
  the activations of all m micro-batches until its backward passes start.
- `1f1b` (one forward, one backward; PipeDream-flush): stage s runs S-1-s forwards to fill the pipeline, then
  alternates one forward and one backward, then drains. At most S - s micro-batches are in flight on stage s
  (forward run, backward not yet), so activation memory is bounded by S, whatever m.

Both have the same bubble, (S-1)/(m+S-1) of each stage's time when stages cost the same, and the same bits:
a micro-batch's gradient does not depend on when it was computed, and the tree sums them in micro-batch order.
"""

from __future__ import annotations

Event = tuple[str, int]  # ("F" or "B", micro-batch index within the pipeline)


def gpipe(num_stages: int, num_micro_batches: int) -> list[list[Event]]:
    """Per stage: F0 .. F(m-1), then B(m-1) .. B0."""
    forward = [("F", j) for j in range(num_micro_batches)]
    backward = [("B", j) for j in reversed(range(num_micro_batches))]
    return [forward + backward for _ in range(num_stages)]


def one_f_one_b(num_stages: int, num_micro_batches: int) -> list[list[Event]]:
    """Per stage s: min(S-1-s, m) forwards, then (F, B) pairs, then the remaining backwards."""
    out = []
    for stage in range(num_stages):
        warmup = min(num_stages - 1 - stage, num_micro_batches)
        events = [("F", j) for j in range(warmup)]
        for j in range(num_micro_batches - warmup):
            events += [("F", warmup + j), ("B", j)]
        events += [("B", j) for j in range(num_micro_batches - warmup, num_micro_batches)]
        out.append(events)
    return out


SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe}


def build_order(per_stage: list[list[Event]]) -> list[tuple[int, Event]]:
    """One order of every (stage, event) in which each event comes after what it needs (the forward of the
    stage before, or the backward of the stage after) and after the stage's previous event: the order the
    graph is built in.

    Raises:
      ValueError: the schedule cannot run (an event waits on one that waits on it).
    """
    last = len(per_stage) - 1
    done, order, next_index = set(), [], [0] * len(per_stage)

    def ready(stage: int, event: Event) -> bool:
        kind, j = event
        if kind == "F":
            return stage == 0 or (stage - 1, ("F", j)) in done
        return (stage, ("F", j)) in done and (stage == last or (stage + 1, ("B", j)) in done)

    while len(order) < sum(map(len, per_stage)):
        progressed = False
        for stage, events in enumerate(per_stage):
            while next_index[stage] < len(events) and ready(stage, events[next_index[stage]]):
                item = (stage, events[next_index[stage]])
                done.add(item)
                order.append(item)
                next_index[stage] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"the schedule deadlocks after {len(order)} events: {per_stage}")
    return order


def in_flight(events: list[Event]) -> int:
    """The most micro-batches a stage holds between their forward and their backward, over its sequence."""
    alive, most = set(), 0
    for kind, j in events:
        if kind == "F":
            alive.add(j)
            most = max(most, len(alive))
        else:
            alive.discard(j)
    return most


def bubble(num_stages: int, num_micro_batches: int) -> float:
    """The idle fraction of each stage's time when every stage's forward and backward cost the same:
    (S-1) / (m+S-1)."""
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)
