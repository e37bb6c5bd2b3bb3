"""`python -m benchmarks.probes dtensor [--width=W] [--shards=2,4]`: whether `tf.experimental.dtensor` can hold one
Dense kernel [W, 4W] split over logical CPUs, train it, keep the bits and live inside towerflow's step.

Issue #34, item 5. Each check runs in its own process (a C++ CHECK failure or a segfault kills the process, and
logical devices are set once per process), which prints its rows as one `RESULT <json>` line; a process that
dies is reported as a row, with its signal or exit code and the last line of its stderr. The checks:

  issue_106304          the reproducer of tensorflow#106304 as filed (create_mesh on CPU:0, CPU:1 without
                        logical devices, then pack), and again after splitting the CPU into 2 logical devices
  sharded:SPLIT:N       (a) mesh of N logical CPUs, the kernel packed as a DVariable, layout [UNSHARDED, 'x']
                        (SPLIT = output) or ['x', UNSHARDED] (reduction); (b) y = x @ W, a squared-error loss,
                        dL/dW and dL/dx under a GradientTape in a tf.function; (c) one SGD update; (d) each of
                        y, the loss, dL/dW, dL/dx and the updated W against the same tf.function on one device
                        (a plain tf.Variable on CPU:0), bitwise and as the max abs difference
  mixed:N               regular tensors and variables on /device:CPU:i in a tf.function that also uses DTensors
  keras:N               Keras 3 Dense (stateless_call with a DTensor kernel, as towerflow's towers call models),
                        and keras.distribution's ModelParallel on the TensorFlow backend
  dtensor_init:N        DTensor's own set-up (initialize_accelerator_system splits the CPU) instead of
                        towerflow's logical devices: the sharded kernel, and keras.distribution again

Op determinism is on in every check. Prints one Markdown table (docs/facts.md, "DTensor on TensorFlow 2.21").
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys

import numpy as np

from benchmarks.harness.isolated import attempt, compare, row, run_isolated, table

SPLITS = ("output", "reduction")
BATCH = 32
INPUTS = ("x", "target", "labels")  # step's arguments after the kernel, all replicated
QUANTITIES = ("y", "loss", "dL/dW", "dL/dx", "dL/dW, softmax cross-entropy")  # step's outputs
LEARNING_RATE = 0.125  # a power of two: lr * grad is exact, so the update's bits are the subtraction's alone


# --- the checks, each in its own process ------------------------------------------------------------------------


def _mesh(shards: int):
    """Op determinism on, the CPU split into `shards` logical devices as towerflow splits it, a 1-D mesh 'x'."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from trainer.system import devices

    tf.config.experimental.enable_op_determinism()
    devices.configure_logical_cpus(shards)
    return dtensor.create_mesh([("x", shards)], device_type="CPU")


def gather(value) -> np.ndarray:
    """A DTensor's global value: its components concatenated along the sharded axis (so no DTensor op takes part);
    a replicated DTensor's first component, after checking every copy has the same bits.

    Raises:
      AssertionError: the copies of a replicated DTensor differ.
    """
    from tensorflow.experimental import dtensor

    specs = dtensor.fetch_layout(value).sharding_specs
    parts = [np.asarray(p) for p in dtensor.unpack(value)]
    sharded = [axis for axis, spec in enumerate(specs) if spec != dtensor.UNSHARDED]
    if sharded:
        return np.concatenate(parts, axis=sharded[0])
    assert all(np.array_equal(p, parts[0]) for p in parts), "replicated copies differ"
    return parts[0]


def inputs(width: int) -> dict[str, np.ndarray]:
    """Kernel [W, 4W], replicated input x [B, W], target [B, 4W] and class labels [B] in [0, 4W) (seed 0;
    float32 but the labels; the kernel scaled by 1/sqrt(W))."""
    rng = np.random.RandomState(0)
    kernel = (rng.standard_normal((width, 4 * width)) / np.sqrt(width)).astype(np.float32)
    x = rng.standard_normal((BATCH, width)).astype(np.float32)
    target = rng.standard_normal((BATCH, 4 * width)).astype(np.float32)
    return {"kernel": kernel, "x": x, "target": target, "labels": rng.randint(0, 4 * width, BATCH).astype(np.int32)}


def step_functions():
    """(step, update) tf.functions shared by the sharded and the one-device run: step(W, x, t, labels) -> y,
    the squared-error loss, its dL/dW and dL/dx, and dL/dW of a softmax cross-entropy over y's last dimension
    (a language model's output layer split over its vocabulary); update(W, g) applies W -= lr * g."""
    import tensorflow as tf

    @tf.function
    def step(kernel, x, target, labels):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = tf.matmul(x, kernel)
            loss = tf.reduce_sum(tf.square(y - target)) / float(np.prod(target.shape))
            softmax = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, y))
        grad_kernel, grad_x = tape.gradient(loss, [kernel, x])
        return y, loss, grad_kernel, grad_x, tape.gradient(softmax, kernel)

    @tf.function
    def update(kernel, grad):
        kernel.assign_sub(LEARNING_RATE * grad)

    return step, update


def sharded_variable(kernel: np.ndarray, specs: list, mesh):
    """`kernel` as a DVariable of layout `specs` on `mesh`, packed from its numpy pieces (pack is the call of
    tensorflow#106304)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    axis = [i for i, spec in enumerate(specs) if spec != dtensor.UNSHARDED][0]
    parts = [tf.constant(p) for p in np.split(kernel, mesh.num_local_devices(), axis=axis)]
    return dtensor.DVariable(dtensor.pack(parts, dtensor.Layout(specs, mesh)))


def one_device(step, update, data: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`step`'s outputs and the updated W of the same functions with a plain tf.Variable on CPU:0."""
    import tensorflow as tf

    with tf.device("/device:CPU:0"):
        plain = tf.Variable(data["kernel"])
        out = step(plain, *(tf.constant(data[k]) for k in INPUTS))
        update(plain, out[2])
    return [t.numpy() for t in out] + [plain.numpy()]


def check_sharded(split: str, shards: int, width: int) -> list[dict]:
    """(a)-(d) for one split of the kernel over `shards` logical CPUs."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    name, data = f"sharded:{split}:{shards}", inputs(width)
    specs = {"output": [dtensor.UNSHARDED, "x"], "reduction": ["x", dtensor.UNSHARDED]}[split]

    def create():
        kernel = sharded_variable(data["kernel"], specs, _mesh(shards))
        return kernel, f"W {data['kernel'].shape} layout {kernel.layout.sharding_specs}"

    created, kernel = attempt(name, "a. mesh + sharded DVariable (pack)", create)
    if kernel is None:
        return [created]
    step, update = step_functions()
    mesh = kernel.layout.mesh
    args = [dtensor.copy_to_mesh(tf.constant(data[k]), dtensor.Layout.replicated(mesh, data[k].ndim)) for k in INPUTS]

    def run_step():
        out = step(kernel, *args)
        layouts = [dtensor.fetch_layout(t).sharding_specs for t in out]
        like = layouts[2] == kernel.layout.sharding_specs
        return out, f"y {layouts[0]}, dL/dW {layouts[2]} (sharded like W: {like}), dL/dx {layouts[3]}"

    stepped, out = attempt(name, "b. y, loss, gradients in a tf.function", run_step)
    if out is None:
        return [created, stepped]
    got = [gather(t) for t in out]
    repeat = all(np.array_equal(gather(t), g) for t, g in zip(step(kernel, *args), got, strict=True))
    updated, _ = attempt(name, "c. SGD update", lambda: (update(kernel, out[2]), f"W {kernel.layout.sharding_specs}"))
    rows, want = [created, stepped, updated], one_device(step, update, data)
    rows += [compare(name, q, g, w) for q, g, w in zip(QUANTITIES, got, want[:-1], strict=True)]
    if updated["result"] == "ok":
        rows.append(compare(name, "W after update", gather(kernel.read_value()), want[-1]))
    return rows + [row(name, "bits b. run twice", "equal" if repeat else "differs", "all of b.")]


def check_issue_106304(logical: bool) -> list[dict]:
    """tensorflow#106304's reproducer as filed; with `logical`, after splitting the CPU into 2 devices first."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    name = "issue_106304" + (", 2 logical CPUs" if logical else ", as filed")
    if logical:
        from trainer.system import devices

        devices.configure_logical_cpus(2)
    created, mesh = attempt(name, "create_mesh([('x', 2)], devices=['CPU:0', 'CPU:1'])", lambda: (
        dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"]), ""))  # fmt: skip
    if mesh is None:
        return [created]
    layout = dtensor.Layout(["x"], mesh)

    def as_filed():
        return None, str(dtensor.pack([1.0, 2.0], layout))

    def as_tensors():
        packed = dtensor.pack([tf.constant([1.0]), tf.constant([2.0])], layout)
        return None, str([t.numpy().tolist() for t in dtensor.unpack(packed)])

    return [
        created,
        attempt(name, "pack([1.0, 2.0], Layout(['x'], mesh)) (the issue's)", as_filed)[0],
        attempt(name, "pack([[1.0], [2.0]] as tensors), unpack", as_tensors)[0],
    ]


def check_mixed(shards: int) -> list[dict]:
    """Regular (non-DTensor) tensors and variables placed with tf.device in a tf.function that uses a DTensor."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    name, data = f"mixed:{shards}", inputs(8)
    replicated = dtensor.Layout.replicated(_mesh(shards), 2)
    kernel = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(data["kernel"]), replicated))
    x = dtensor.copy_to_mesh(tf.constant(data["x"]), replicated)
    device = f"/device:CPU:{shards - 1}"
    with tf.device(device):
        plain_kernel, plain_x = tf.Variable(data["kernel"]), tf.Variable(data["x"])

    def placed():
        with tf.device(device):
            return tf.matmul(plain_x, plain_kernel)

    def where(value) -> str:
        if dtensor.is_dtensor(value):
            return f"a DTensor, layout {dtensor.fetch_layout(value).sharding_specs} on the mesh"
        return f"a regular tensor on {value.device}"

    def variables_and_dtensor():
        regular, _ = tf.function(lambda: (placed(), tf.matmul(x, kernel)))()
        alone = tf.function(placed)().numpy()
        bits = np.array_equal(gather(regular) if dtensor.is_dtensor(regular) else regular.numpy(), alone)
        return None, f"the {device} matmul came back as {where(regular)}; its bits equal the plain function's: {bits}"

    def argument():
        return None, where(tf.function(lambda t: tf.matmul(t, kernel))(x))

    def regular_argument():
        return None, where(tf.function(lambda t: tf.matmul(dtensor.copy_to_mesh(t, replicated), kernel))(
            tf.constant(data["x"])))  # fmt: skip

    def unpack_inside():
        return None, str(tf.function(lambda: dtensor.unpack(tf.matmul(x, kernel)))())

    return [
        attempt(name, f"regular tf.Variables under tf.device('{device}') + a DTensor op", variables_and_dtensor)[0],
        attempt(name, "DTensor argument (copied to the mesh eagerly, before the call)", argument)[0],
        attempt(name, "regular tensor argument, copy_to_mesh inside the tf.function", regular_argument)[0],
        attempt(name, "dtensor.unpack inside a tf.function", unpack_inside)[0],
    ]


def check_keras(shards: int, width: int) -> list[dict]:
    """Keras 3 Dense with the kernel sharded along its output: stateless_call (towerflow's way of running a
    model) under a GradientTape in a tf.function against the same on one device, and the layer's own variable
    given the DVariable; then keras.distribution on the TensorFlow backend."""
    import keras
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    name, data = f"keras:{shards}", inputs(width)
    mesh = _mesh(shards)
    kernel = sharded_variable(data["kernel"], [dtensor.UNSHARDED, "x"], mesh)
    layer = keras.layers.Dense(4 * width, use_bias=False)
    layer.build((None, width))

    @tf.function
    def forward_backward(kernel, x):
        with tf.GradientTape() as tape:
            tape.watch(kernel)
            y, _ = layer.stateless_call([kernel], [], x)
            loss = tf.reduce_sum(tf.square(y)) / float(y.shape[0] * y.shape[1])
        return y, tape.gradient(loss, kernel)

    def stateless():
        x = dtensor.copy_to_mesh(tf.constant(data["x"]), dtensor.Layout.replicated(mesh, 2))
        y, grad = forward_backward(kernel.read_value(), x)
        with tf.device("/device:CPU:0"):
            want = forward_backward(tf.constant(data["kernel"]), tf.constant(data["x"]))
        bits = [np.array_equal(gather(g), w.numpy()) for g, w in zip((y, grad), want, strict=True)]
        layouts = [dtensor.fetch_layout(t).sharding_specs for t in (y, grad)]
        return None, f"y {layouts[0]}, dL/dW {layouts[1]}; bits equal one device: y {bits[0]}, dL/dW {bits[1]}"

    def assign():
        layer.kernel.assign(kernel)
        value = layer.kernel.value
        return None, f"the kernel stays a plain variable on {value.device} (is_dtensor {dtensor.is_dtensor(value)})"

    return [
        attempt(name, "Dense.stateless_call with the sharded kernel, GradientTape, tf.function", stateless)[0],
        attempt(name, "Dense.kernel.assign(the DVariable)", assign)[0],
        *keras_distribution(name, shards, width),
    ]


def keras_distribution(name: str, shards: int, width: int) -> list[dict]:
    """keras.distribution's ModelParallel and TensorLayout on the TensorFlow backend, and what its file says."""
    import keras
    from keras import distribution
    from tensorflow.experimental import dtensor

    device_mesh = distribution.DeviceMesh((shards,), ["model"], distribution.list_devices("cpu"))

    def model_parallel():
        layout_map = distribution.LayoutMap(device_mesh)
        layout_map[".*kernel"] = (None, "model")
        with distribution.ModelParallel(layout_map=layout_map, batch_dim_name=None).scope():
            dense = keras.layers.Dense(4 * width, use_bias=False)
            dense.build((None, width))
        value = dense.kernel.value
        return None, f"kernel is_dtensor {dtensor.is_dtensor(value)}, on {value.device}: the layout map is not applied"

    def backend_layout():
        return None, str(distribution.TensorLayout([None, "model"], device_mesh).backend_layout.sharding_specs)

    backend = importlib.import_module("keras.src.backend.tensorflow.distribution_lib")
    return [
        attempt(name, "keras.distribution.ModelParallel, LayoutMap kernel (None, 'model')", model_parallel)[0],
        attempt(name, "keras.distribution.TensorLayout.backend_layout", backend_layout)[0],
        row(name, "keras/src/backend/tensorflow/distribution_lib.py says", "quote", " ".join(backend.__doc__.split())),
    ]


def check_dtensor_init(shards: int, width: int) -> list[dict]:
    """DTensor's own set-up instead of towerflow's logical devices (initialize_accelerator_system splits the
    CPU itself), then the sharded kernel and keras.distribution again."""
    from tensorflow.experimental import dtensor

    name = f"dtensor_init:{shards}"

    def initialize():
        dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=shards)
        mesh = dtensor.create_mesh([("x", shards)], device_type="CPU")
        kernel = sharded_variable(inputs(width)["kernel"], [dtensor.UNSHARDED, "x"], mesh)
        return None, f"{dtensor.num_local_devices('CPU')} CPU devices, W layout {kernel.layout.sharding_specs}"

    initialized = attempt(name, "initialize_accelerator_system('CPU'), create_mesh, sharded DVariable", initialize)
    return [initialized[0], *keras_distribution(name, shards, width)[:2]]


def plan(shards: list[int]) -> list[str]:
    """The checks to run, in order."""
    checks = ["issue_106304", "issue_106304:logical"]
    for n in shards:
        checks += [f"sharded:{split}:{n}" for split in SPLITS] + [f"mixed:{n}", f"keras:{n}", f"dtensor_init:{n}"]
    return checks


def run_check(check: str, width: int) -> list[dict]:
    """The rows of one check, in this process."""
    kind, *args = check.split(":")
    if kind == "issue_106304":
        return check_issue_106304(logical=bool(args))
    if kind == "sharded":
        return check_sharded(args[0], int(args[1]), width)
    if kind == "mixed":
        return check_mixed(int(args[0]))
    return {"keras": check_keras, "dtensor_init": check_dtensor_init}[kind](int(args[0]), width)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes dtensor", description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=256, help="W of the Dense kernel [W, 4W]")
    parser.add_argument("--shards", default="2,4", help="logical CPUs to split the kernel over, comma-separated")
    parser.add_argument("--checks", default="", help="only the checks whose name starts with one of these (comma)")
    parser.add_argument("--check", default="", help=argparse.SUPPRESS)  # one check, in this process
    args = parser.parse_args(argv)
    shards = [int(n) for n in args.shards.split(",") if n.isdigit() and int(n) > 1]
    if len(shards) != len(args.shards.split(",")) or any(4 * args.width % n for n in shards):
        parser.error(f"--shards={args.shards}: give counts > 1 that divide 4 * --width ({4 * args.width}), e.g. 2,4")
    if args.check:
        print("RESULT " + json.dumps(run_check(args.check, args.width)), flush=True)
        return
    prefixes = tuple(p for p in args.checks.split(",") if p) or ("",)
    checks = [c for c in plan(shards) if c.startswith(prefixes)]
    rows = []
    for check in checks:
        command = [sys.executable, "-m", "benchmarks.probes", "dtensor", f"--check={check}", f"--width={args.width}"]
        rows += run_isolated(check, command)
    version, width = importlib.metadata.version("tensorflow"), args.width
    print(f"TensorFlow {version}, W = {width} (kernel [{width}, {4 * width}]), batch {BATCH}")
    print("\n".join(table(rows)))
