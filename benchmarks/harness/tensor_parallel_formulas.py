"""The formulas `benchmarks/probes/tensor_parallel.py` sets its counts beside: the state per device, the bytes a
step moves as designed and as Megatron counts them, what one layer moves, the tree's crossings, and the 8-GPU
projection (docs/tensor_parallel.md). Pure arithmetic: no TensorFlow."""

from __future__ import annotations

import dataclasses

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
