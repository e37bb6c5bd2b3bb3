"""`python -m benchmarks.probes tensor_parallel [--layers=4] [--heads=8] [--width=256] [--context=128]
[--micro_batch=4] [--shards=4] [--parallel=1,2,4] [--time_steps=5] [--windows=3] [--per_layer] [--devices=4]
[--json=FILE] [--rows=FILE]`: what `--tensor_parallel=T` costs and saves for the built-in LM (`--task=lm`) on
byte tokens (vocabulary 256) it prepares from the built-in corpus, one tower (no data parallelism), K = 1
micro-batch, AdamW, on `--devices` logical CPU devices (docs/tensor_parallel.md; results:
benchmarks/results/tensor-parallel.md).

Per layout (T = each of `--parallel` with N = `--shards`, and T = 1 with N = 1, the model without shards):
- memory per device, as `--device_memory_mb` counts it (`device_memory.needs`): state (variables, AdamW's two
  slots, gradients) beside `state_formula`, the activations one micro-batch keeps for its backward, and what
  any gradient op (the tape's or a shard's own) reads of what the device's forward made;
- the bytes each device sends and receives per step, counted from the traced step graph as `traffic.count`
  walks it (an unknown dimension at its size), by kind (`_kind`), beside the design's formula
  (`towerflow_bytes`: every split block's input copied to the other devices, its partials summed along the tree,
  forward and backward, plus the ids, targets and the softmax's numbers per position) and Megatron's
  (`megatron_bytes`: 4 ring all-reduces of A per layer plus the embedding's and the head's); with `--per_layer`,
  each T built again at one layer fewer: what one layer moves, beside `layer_formula` (what the traced step
  moves, exactly) and the design's;
- with `--time_steps`, each layout in a fresh subprocess: the first step's CPU-seconds since the build began
  (build, trace, one step), then examples/s, the median of `--windows` windows after an untimed one;
- a projection for 8 GPUs by formula (`project`), not measured.

Nothing here is a GPU figure: the logical devices share the machine's cores.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

VOCAB = 256  # byte tokens
FLOAT = 4  # float32 activations
INT = 4  # int32 ids and targets


@dataclasses.dataclass(frozen=True)
class Size:
    layers: int = 4
    heads: int = 8
    width: int = 256
    context: int = 128
    micro_batch: int = 4  # sequences per micro-batch (K = 1)

    @property
    def positions(self) -> int:  # b x s
        return self.micro_batch * self.context

    @property
    def activation(self) -> int:  # A: bytes of one b x s x h float32 activation
        return self.positions * self.width * FLOAT


def byte_records(root: str, context: int) -> str:
    """Byte-token records of the built-in corpus, at `context` (every record full); returns the train glob."""
    from data import prepare
    from data import text as text_data

    path = pathlib.Path(root)
    (path / "text.txt").write_text(text_data.default_corpus()[0][:40000], encoding="utf-8")
    argv = ["text", str(path / "text.txt"), str(path / "records"), f"--context={context}", "--tokens=byte"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert prepare.main(argv) == 0
    return str(path / "records" / "train-*")


def build(size: Size, parallel: int, shards: int, train_data: str, model_dir: str):
    """The trainer of one tower of `parallel` logical CPU devices, every wide layer in `shards` shards."""
    from trainer.loop.build import build as build_trainer
    from trainer.settings import config as cfg

    towers = cfg.TowerConfig(
        num_towers=parallel,
        device="cpu",
        global_batch_size=size.micro_batch,
        micro_batches=1,
        tensor_parallel=parallel,
        tensor_shards=shards,
    )
    options = {"layers": size.layers, "heads": size.heads, "width": size.width, "context": size.context}
    config = cfg.RunConfig(
        towers=towers,
        loop=cfg.LoopConfig(model_dir=model_dir, train_steps=1000, export=False),
        data=cfg.DataConfig(train_data=train_data, eval_data=train_data),  # eval: not read here
        task=cfg.TaskConfig(name="lm", options=options),
        optimizer=cfg.OptimizerConfig(name="adamw"),
    )
    return build_trainer(config)


def measure(
    size: Size, parallel: int, shards: int, train_data: str, model_dir: str, time_steps: int = 0, windows: int = 3
) -> dict:
    """One layout's row: memory and traffic per device (MiB, bytes) and, with `time_steps`, its speed."""
    from trainer.step.memory import device_memory

    cpu_start, wall_start = time.process_time(), time.perf_counter()
    trainer = build(size, parallel, shards, train_data, model_dir)
    row = {"parallel": parallel, "shards": shards, "build_sec": time.perf_counter() - wall_start}
    try:
        if time_steps:
            row.update(_speed(trainer.updater, time_steps, cpu_start, windows))
        needs = device_memory.needs(trainer.updater, trainer.optimizer, size.context + 1)
        row["devices"] = [_short(n.device) for n in needs]
        row["state"] = [n.state for n in needs]
        row["kept"] = [n.kept * n.in_flight for n in needs]
        graph = trainer.updater.step_graph()
        counted = count(graph, trainer.placement.host, size)
        row["sent"] = {d: counted.sent.get(d, 0) for d in row["devices"]}
        row["received"] = {d: counted.received.get(d, 0) for d in row["devices"]}
        row["unknown_edges"] = counted.unknown
        row["kinds"] = dict(counted.kinds)
        row["kept_any_backward"] = [counted.kept_for_backward(graph, d) for d in row["devices"]]
        row["parameters"] = sum(int(math.prod(v.shape)) for v in trainer.model.trainable_variables)
    finally:
        trainer.updater.close()
    return row


def count(graph, host: str, size: Size):
    """`traffic.count`'s walk over the step graph, with two differences: a dimension unknown when the step
    traces is counted at its size here (a leading one, the flattened positions of an embedding's gradient, at
    b x s; any other, the padded length, at s: every record is full), where `traffic.count` skips the edge;
    and each edge's bytes are also added to a kind (`_kind`)."""
    from trainer.step.transfers import traffic

    counter = _KindCounter(size)
    where = {inner.ref(): traffic.short_device(getattr(outer, "device", "") or "") for outer, inner in graph.captures}
    counter.walk(graph, where, traffic.short_device(host))
    return counter


def _kind_counter_class():
    from trainer.step.transfers import traffic

    class KindCounter(traffic._Counter):
        def __init__(self, size: Size):
            super().__init__(lambda device: device)
            self.size, self.kinds = size, collections.Counter()
            self._consumer = None

            self.device_of = {}

        def _device(self, op, *args):
            self._consumer = op
            self.device_of[op.name] = super()._device(op, *args)
            return self.device_of[op.name]

        def kept_for_backward(self, graph, device: str) -> int:
            return _kept_for_backward(graph, device, self.device_of, self._bytes)

        def _edge(self, tensor, producer, consumer):
            if not producer or producer == consumer or (tensor.ref(), consumer) in self._seen:
                return
            self._seen.add((tensor.ref(), consumer))
            size = self._bytes(tensor)
            self.sent[producer] += size
            self.received[consumer] += size
            self.tensors_sent[producer] += 1
            self.tensors_received[consumer] += 1
            self.kinds[_kind(tensor, self._consumer)] += size

        def _bytes(self, tensor) -> int:
            return 0 if traffic.tensor_bytes(tensor) == 0 else _filled_bytes(tensor, self.size)

    return KindCounter


def _filled_bytes(tensor, size: Size) -> int:
    """A tensor's bytes, an unknown leading dimension at b x s (flattened positions), any other at s."""
    if tensor.shape.rank is None:
        return 0
    dims = [d if d is not None else size.positions if i == 0 else size.context for i, d in enumerate(tensor.shape)]
    return math.prod(dims) * tensor.dtype.size


def _kept_for_backward(graph, device: str, device_of: dict, size_of) -> int:
    """Bytes of the tensors forward ops make on `device` that any gradient op reads: the tape's
    (`gradient_tape/...`) and a shard's own (`tf.gradients`' `.../gradients_K/...`), counted once, each
    dimension unknown at trace at its size (as the traffic); variables' values and constants left out."""
    kept = {}
    for op in graph.get_operations():
        if not _is_gradient(op.name):
            continue
        for tensor in op.inputs:
            made = tensor.op
            if _is_gradient(made.name) or _kind(tensor, op) in ("weights", "scalars") or made.type == "Const":
                continue  # a variable's value is state, not an activation
            if device_of.get(made.name) == device:
                kept[tensor.name] = size_of(tensor)
    return sum(kept.values())


def _KindCounter(size: Size):  # noqa: N802 (a class made when TensorFlow is imported)
    return _kind_counter_class()(size)


def _kind(tensor, consumer) -> str:
    """What an edge carries: `weights` (a variable's value read on its device, consumed elsewhere), `scalars`
    (rank 0: the optimizer's step and learning rate, the gradient norm's parts), `embedding gradient` (a
    shard's gradient rows and their densified sum), else `activations` (activations, their gradients, ids,
    targets, the mask, the softmax's numbers per position)."""
    op = tensor.op
    if op.type == "Identity" and op.inputs and op.inputs[0].op.type == "ReadVariableOp":
        return "weights"
    if op.type == "ReadVariableOp" or tensor.shape.rank == 0:
        return "scalars"
    if "GatherV2_grad" in op.name or op.type == "UnsortedSegmentSum":
        return "embedding gradient"
    if op.type == "IdentityN" or consumer.type == "IdentityN":
        return "custom-gradient IdentityN"
    if op.name.startswith("gradient_tape/"):
        return "tape gradient"
    return "activations"


def _is_gradient(name: str) -> bool:
    return name.startswith("gradient_tape/") or "/gradients" in name


def _speed(updater, steps: int, cpu_start: float, windows: int = 3) -> dict:
    """The first step's CPU-seconds since the build began (build + trace + one step) and its wall seconds; then
    one untimed window of `steps` (a window of several steps traces its own function), then examples/s, the
    median of `windows` windows of `steps`."""
    start = time.perf_counter()
    updater.train_steps(1)
    first = {"first_step_cpu_sec": time.process_time() - cpu_start, "first_step_sec": time.perf_counter() - start}
    updater.train_steps(steps)
    rates = []
    for _ in range(windows):
        start = time.perf_counter()
        updater.train_steps(steps)
        rates.append(steps * updater.examples_per_step / (time.perf_counter() - start))
    return {**first, "examples_per_sec": statistics.median(rates), "rates": rates}


def _short(device: str) -> str:
    return device.rsplit("device:", 1)[-1]


# --- formulas ---------------------------------------------------------------------------------------------------


def state_formula(size: Size, parallel: int, shards: int) -> list[int]:
    """Bytes of state per device: each parameter 4 times (variable, 2 AdamW slots, gradient) in float32; the
    split weights (q, k, v, mlp_in with their biases, out and mlp_out without, embedding, head) spread evenly
    over the T devices, the rest (LayerNorms, positions, row biases) on the first; AdamW's iteration counter
    (int64) on the first."""
    w, layers = size.width, size.layers
    split = layers * (12 * w * w + 7 * w) + 2 * VOCAB * w
    whole = layers * 6 * w + size.context * w + 2 * w
    if shards == 1:
        split, whole = 0, split + whole
    per_device = [4 * FLOAT * split // parallel for _ in range(parallel)]
    per_device[0] += 4 * FLOAT * whole + 8
    return per_device


def towerflow_bytes(size: Size, parallel: int) -> dict:
    """Total bytes one step moves between the devices of the tower, by formula, per part (see the docstring)."""
    t, a, bs = parallel, size.activation, size.positions
    if t == 1:
        return {"activations": 0, "ids and targets": 0, "softmax per position": 0}
    return {
        # per layer: attention and MLP, each a copy of its input out and its partials' sum in, forward and backward
        # (8 x (T-1) x A); the embedding: the rows' sum forward, their gradient copied back (2 x (T-1) x A); the
        # head: its input copied out forward, the copies' gradients summed backward (2 x (T-1) x A)
        "activations": (4 * size.layers + 2) * 2 * (t - 1) * a,
        # the ids to each other shard device (embedding), the targets too (the softmax's target logit)
        "ids and targets": 2 * (t - 1) * bs * INT,
        # vocabulary-parallel cross-entropy: the shards' maxima summed along the tree, the top copied back, the
        # sums of exponentials and the target logits summed; backward: their two gradients copied back
        "softmax per position": 6 * (t - 1) * bs * FLOAT,
    }


def megatron_bytes(size: Size, parallel: int) -> int:
    """Megatron's count: per layer 4 all-reduces of A (2 forward, 2 backward), plus the embedding's (forward)
    and the head's input gradient (backward); a ring all-reduce moves 2(T-1)/T x A per device, 2(T-1) x A in all."""
    return (4 * size.layers + 2) * 2 * (parallel - 1) * size.activation


ACTIVATION_KINDS = ("activations", "custom-gradient IdentityN", "tape gradient")


def moved_activations(row: dict) -> int:
    """The bytes of a row's edges that carry activations or their gradients (not weights, the embedding's
    gradient, or scalars)."""
    return sum(row["kinds"].get(kind, 0) for kind in ACTIVATION_KINDS)


def tree_crossings(shards: int, parallel: int, leaves_on_first: bool) -> int:
    """Edges of `models.sharded.tree` over `shards` parts that cross devices at T = `parallel` (node on the
    device of its first shard, shard k on device k*T//N); leaf k on its shard's device, or all on the first."""

    def node(lo: int, hi: int) -> tuple[int, int]:  # (device, crossings below)
        if hi - lo == 1:
            return (0 if leaves_on_first else lo * parallel // shards), 0
        mid = (lo + hi) // 2
        (left, a), (right, b) = node(lo, mid), node(mid, hi)
        here = lo * parallel // shards
        return here, a + b + (left != here) + (right != here)

    return node(0, shards)[1]


def layer_formula(size: Size, parallel: int, shards: int) -> dict:
    """Bytes one Transformer layer (its two split blocks) moves per step at T = `parallel`, N = `shards`: as
    designed (`scheme`: per block, its input copied to the T-1 other devices and its partials summed along the
    tree, forward; the output's gradient copied out and the input gradients summed, backward: 4(T-1) x A; as
    Megatron's 2 all-reduces of 2(T-1) x A) and as the traced step moves it (`counted`, see the docstring)."""
    t, a = parallel, size.activation
    scheme = 2 * 4 * (t - 1) * a
    # per block, as the step runs it (`traffic.live_ops`): the block's input copied to each other device (once
    # per device where its shards form a node of the tree, else once per shard: `copies`); the output's gradient
    # out once per device (T-1); the partials' and the input gradients' trees cross as designed. Matched exactly
    # at N = 2, T = 2, N = 4, T = 2 and 4 (8, 8 and 24 A a layer, the design's) and N = T = 8.
    trees = 2 * tree_crossings(shards, t, leaves_on_first=False)
    per_block = copies(shards, t) + trees + (t - 1)
    return {"scheme": scheme, "counted": 2 * per_block * a if t > 1 else 0}


def copies(shards: int, parallel: int) -> int:
    """Copies of a split block's input the tower's first device sends (`models.sharded.to_shards`): one per
    other device where each device's shards form a node of the tree, else one per shard off the first device."""
    from models.sharded import device_blocks

    return sum(1 for lo, _ in device_blocks(shards, parallel) if lo * parallel // shards != 0)


def busiest_per_block(parallel: int, shards: int) -> dict:
    """Activation-sized tensors (units of A) the tower's first device sends and receives per split block and
    step, as the step runs them (every shard's part on its own device) and as designed (a copy out to each
    other device and a tree in, forward and backward)."""
    t = parallel
    into_first = _tree_into_first(shards, t)
    return {
        "counted sent": copies(shards, t) + (t - 1),
        "counted received": 2 * into_first,
        "scheme sent": 2 * (t - 1),
        "scheme received": 2 * into_first,
    }


def _walk(shards: int, parallel: int, leaves_on_first: bool) -> list[tuple[int, int, bool]]:
    """(child device, parent device, child is a leaf) of each edge of the tree."""
    edges = []

    def node(lo: int, hi: int) -> int:
        if hi - lo == 1:
            return 0 if leaves_on_first else lo * parallel // shards
        mid = (lo + hi) // 2
        left, right, here = node(lo, mid), node(mid, hi), lo * parallel // shards
        edges.extend([(left, here, mid - lo == 1), (right, here, hi - mid == 1)])
        return here

    node(0, shards)
    return edges


def _tree_into_first(shards: int, parallel: int) -> int:
    """Edges into the first device of the tree whose leaves are on their shards' devices (log2 T for N = T)."""
    return sum(1 for c, p, _ in _walk(shards, parallel, False) if c != p and p == 0)


GPU = {"NVLink (A100, 300 GB/s per direction)": 300e9, "PCIe 4 x16 (25 GB/s)": 25e9}
PEAK, MFU = 312e12, 0.45  # A100 bf16 dense peak, FLOP/s; the fraction of it a step reaches


def project(layers=12, heads=16, width=768, context=1024, vocab=50304, micro_batch=8, parallel=8) -> list[dict]:
    """A projection, not a measurement: one micro-batch's step of a GPT-2-small-sized model (12 layers, width
    768, context 1024; 16 heads of 48, which 8 divides, as 12 does not; GPT-2's vocabulary padded to 50,304, a
    multiple of 8) on one tower of T GPUs: bytes through the first device (bf16 activations) against the compute
    time at `MFU` of the A100's peak."""
    a = micro_batch * context * width * 2
    blocks = 2 * layers + 1  # the embedding's and the head's exchanges count as one block's
    tokens = micro_batch * context
    params = layers * (12 * width * width + 13 * width) + 2 * vocab * width + context * width
    compute = (6 * params * tokens + 12 * layers * width * context * tokens) / parallel / (PEAK * MFU)
    per = busiest_per_block(parallel, parallel)
    ring = blocks * 2 * 2 * (parallel - 1) / parallel * a  # Megatron: 2 all-reduces a block, each device sends this
    rows = []
    for name, moved in (
        ("Megatron (ring all-reduce)", ring),
        ("towerflow as designed (copy out, tree in)", blocks * per["scheme sent"] * a),
        ("towerflow as it runs", max(blocks * per["counted sent"] * a, blocks * per["counted received"] * a)),
    ):
        row = {"scheme": name, "busiest_bytes": moved, "compute_sec": compute}
        row.update({link: moved / bandwidth for link, bandwidth in GPU.items()})
        rows.append(row)
    return rows


# --- running ----------------------------------------------------------------------------------------------------


def layouts(parallel: list[int], shards: int) -> list[tuple[int, int]]:
    return [(1, 1)] + [(t, shards) for t in parallel]


def _worker(args) -> None:
    from trainer.system import devices

    devices.configure_logical_cpus(args.devices)
    size = _size(args)
    with tempfile.TemporaryDirectory() as root:
        train_data = byte_records(root, size.context)
        for parallel, shards, *layers in _worker_layouts(args):
            sized = dataclasses.replace(size, layers=layers[0]) if layers else size
            model_dir = f"{root}/run{parallel}_{shards}_{sized.layers}"
            row = measure(sized, parallel, shards, train_data, model_dir, args.time_steps, args.windows)
            print(json.dumps({**row, "layers": sized.layers}), flush=True)


def _worker_layouts(args) -> list[tuple[int, ...]]:
    """`--worker=TxN[xL],...`: T, N and optionally the layers (default `--layers`)."""
    return [tuple(int(x) for x in layout.split("x")) for layout in args.worker.split(",")]


def _size(args) -> Size:
    return Size(args.layers, args.heads, args.width, args.context, args.micro_batch)


def run(args, argv: list[str]) -> list[dict]:
    """Every layout, each in a fresh subprocess when timed (a first step that traced nothing before), else all
    in one."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    parallel = [int(t) for t in args.parallel.split(",")]
    every = layouts(parallel, args.shards)
    if args.per_layer:  # the same at one layer fewer: what one layer moves, by difference
        every += [(t, args.shards, args.layers - 1) for t in parallel if t > 1]
    batches = [every] if not args.time_steps else [[layout] for layout in every]
    rows = []
    for batch in batches:
        worker = ",".join("x".join(str(x) for x in layout) for layout in batch)
        command = [sys.executable, "-m", "benchmarks.probes", "tensor_parallel", f"--worker={worker}", *argv]
        out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def report(size: Size, rows: list[dict]) -> str:
    """Markdown tables: memory, traffic (with the per-layer check when rows at one layer fewer exist), speed and
    the projection."""
    full = [r for r in rows if r.get("layers", size.layers) == size.layers]
    return "\n\n".join(
        [_memory_table(size, full), _traffic_table(size, full), _layer_table(size, rows)]
        + ([_speed_table(size, full)] if "examples_per_sec" in full[0] else [])
        + [_projection_table()]
    )


def _markdown(header: list[str], body: list[list]) -> str:
    """A Markdown table of `header` and the rows of cells `body`."""
    lines = [header, ["---"] * len(header), *body]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def _memory_table(size: Size, rows: list[dict]) -> str:
    mib, nan = 1 << 20, float("nan")  # nan: a row written before the column existed
    body = []
    for r in rows:
        formula = state_formula(size, r["parallel"], r["shards"])
        backward = r.get("kept_any_backward", [nan] * len(r["devices"]))
        for i, device in enumerate(r["devices"]):
            state, kept = r["state"][i], r["kept"][i]
            numbers = (state, formula[i], kept, state + kept, backward[i])
            body.append([r["parallel"], r["shards"], device, *(f"{n / mib:.2f}" for n in numbers)])
    header = "T,N,device,state MiB,formula MiB,kept activations MiB,total MiB,read by any backward MiB"
    return _markdown(header.split(","), body)


def _traffic_table(size: Size, rows: list[dict]) -> str:
    kinds = (*ACTIVATION_KINDS, "weights", "embedding gradient", "scalars")
    body = []
    for r in rows:
        t = r["parallel"]
        scheme = sum(towerflow_bytes(size, t).values()) if r["shards"] > 1 else 0
        numbers = [sum(r["sent"].values())] + [r["kinds"].get(k, 0) for k in kinds]
        numbers += [scheme, megatron_bytes(size, t)]
        per_device = [" / ".join(f"{v / 1e6:.3f}" for v in r[way].values()) for way in ("sent", "received")]
        body.append([t, r["shards"], *per_device, *(f"{n / 1e6:.3f}" for n in numbers)])
    header = ["T", "N", "sent MB per device", "received MB per device", "total MB"]
    header += [f"{kind} MB" for kind in kinds] + ["scheme formula MB", "Megatron MB"]
    return _markdown(header, body)


def _layer_table(size: Size, rows: list[dict]) -> str:
    """What one layer adds (rows at `layers` minus rows at `layers - 1`), beside the formulas, in units of A."""
    by = {(r["parallel"], r["shards"], r.get("layers", size.layers)): r for r in rows}
    body = []
    for (t, n, layers), r in sorted(by.items()):
        less = by.get((t, n, layers - 1))
        if layers != size.layers or less is None:
            continue
        moved = moved_activations(r) - moved_activations(less)
        formula = layer_formula(size, t, n)
        first = [(r[k]["CPU:0"] - less[k]["CPU:0"]) / size.activation for k in ("sent", "received")]
        units = (moved, formula["counted"], formula["scheme"])
        body.append(
            [t, n, f"{moved:,}", *(f"{u / size.activation:g}" for u in units), f"{first[0]:.2f} / {first[1]:.2f}"]
        )
    header = ["T", "N", "one layer's activation bytes", "/ A", "formula (traced) / A", "scheme = Megatron / A"]
    return _markdown(header + ["first device sent / received per layer, / A (activations + weights)"], body)


def _speed_table(size: Size, rows: list[dict]) -> str:
    body = [
        [r["parallel"], r["shards"], f"{r['examples_per_sec']:.1f}", f"{size.micro_batch / r['examples_per_sec']:.3f}"]
        + [f"{r['first_step_cpu_sec']:.1f}", f"{r['first_step_sec']:.1f}", " ".join(f"{x:.1f}" for x in r["rates"])]
        for r in rows
    ]
    header = ["T", "N", "examples/s (logical CPU devices)", "s/step", "first step CPU-s (build + trace + step)"]
    return _markdown(header + ["first step s", "each window's examples/s"], body)


def _projection_table() -> str:
    links = list(GPU)
    body = [
        [r["scheme"], f"{r['busiest_bytes'] / 1e9:.2f}", *(f"{1e3 * r[link]:.1f}" for link in links)]
        + [f"{1e3 * r['compute_sec']:.1f}"]
        for r in project()
    ]
    header = ["T = 8, projected", "busiest device GB per step", *(f"ms at {link}" for link in links)]
    return _markdown(header + [f"compute ms at {MFU:.0%} of {PEAK / 1e12:.0f} TFLOP/s"], body)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes tensor_parallel")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--micro_batch", type=int, default=4, help="sequences per micro-batch (K = 1)")
    parser.add_argument("--shards", type=int, default=4, help="N (--tensor_shards)")
    parser.add_argument("--parallel", default="1,2,4", help="T values (--tensor_parallel), each dividing N")
    parser.add_argument("--time_steps", type=int, default=5, help="steps per timed window; 0: no timing")
    parser.add_argument("--windows", type=int, default=3, help="timed windows (median), after an untimed one")
    parser.add_argument("--per_layer", action="store_true", help="also build at one layer fewer (untimed)")
    parser.add_argument("--devices", type=int, default=4, help="logical CPU devices")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--rows", help="print the tables of rows a --json run wrote, running nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    rows = [] if args.rows else run(args, [a for a in argv if not a.startswith("--json")])
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.rows:
        rows = json.loads(pathlib.Path(args.rows).read_text())
    print(report(_size(args), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
