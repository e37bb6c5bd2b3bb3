"""The language model's peers, inside a worker: what users would pick instead of towerflow (issue #45).

"keras_hub_fit": Keras Hub's GPT-2 (`keras_hub.models.GPT2CausalLM` over a `GPT2Backbone` built from a config:
random weights, nothing downloaded), compiled and run in `fit` exactly as `reference.KerasFitSide` runs towerflow's
own model (one device, or MirroredStrategy over 2 or 4 logical CPUs), on the same memory batches.
"nanogpt_torch": nanoGPT's model in PyTorch on the CPU (benchmarks/harness/nanogpt_torch.py), one process with
one thread per core (or `Side.intra_op_threads`), its own training loop over the same batches as tensors.

Both are benchmark-only extras (`pip install -e .[peers]`), imported here on first use: never by the trainer.
Every side has the sizes of `lm.task_config(setting)` and the references' optimizer (SGD, momentum 0.9).
"""

from __future__ import annotations

import os
import time

import numpy as np

from benchmarks.harness import lm, mfu, reference
from benchmarks.harness.plan import Setting, Side


def sizes(setting: Setting, records: dict) -> dict:
    """vocab_size, layers, heads, width and context of the setting's model, as towerflow's task resolves them."""
    task = lm.make_task(setting, records)
    return {"vocab_size": task.vocab_size, "layers": task.layers, "heads": task.heads, "width": task.width,
            "context": task.context}  # fmt: skip


def stats(model_sizes: dict, parameters: int, peak) -> dict:
    """`mfu.side_stats` of a side with `model_sizes` (`sizes`)."""
    s = model_sizes
    return mfu.side_stats(s["vocab_size"], s["layers"], s["width"], s["context"], parameters, peak)


def keras_hub_inputs(tokens: np.ndarray, lengths: np.ndarray) -> tuple:
    """({"token_ids", "padding_mask"}, targets, mask) of records `tokens` [..., T + 1]: `lm.keras_batches` in
    GPT-2's input names and dtypes (an input is real exactly where its target is)."""
    (ids, _), targets, mask = lm.keras_batches(tokens, lengths)
    return {"token_ids": ids, "padding_mask": mask.astype(np.int32)}, targets, mask


class KerasHubFitSide(reference.KerasFitSide):
    """Keras Hub's GPT2CausalLM (tied head, dropout 0) in `fit`, loss weighted by the padding mask."""

    def __init__(self, setting: Setting, records: dict, num_devices: int, steps_per_execution: int, accuracy: bool):
        import tensorflow as tf

        self.sizes = sizes(setting, records)
        tokens, lengths = lm.memory_batches(setting, records["train"])
        dataset = tf.data.Dataset.from_tensor_slices(keras_hub_inputs(tokens, lengths)).repeat()
        super().__init__(setting, dataset, num_devices, steps_per_execution, accuracy)

    def compiled(self, setting: Setting, accuracy: bool, steps_per_execution: int):
        import keras
        import keras_hub

        s = self.sizes
        build = lambda: keras_hub.models.GPT2CausalLM(  # noqa: E731
            backbone=keras_hub.models.GPT2Backbone(
                vocabulary_size=s["vocab_size"], num_layers=s["layers"], num_heads=s["heads"],
                hidden_dim=s["width"], intermediate_dim=4 * s["width"], dropout=0.0,
                max_sequence_length=s["context"],
            ),
            preprocessor=None,
        )  # fmt: skip
        model, optimizer = reference.model_and_optimizer(setting, build)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        weighted = ["accuracy"] if accuracy else []
        model.compile(optimizer, loss, weighted_metrics=weighted, steps_per_execution=steps_per_execution)
        return model

    def stats(self) -> dict:
        return stats(self.sizes, self.model.count_params(), mfu.tensorflow_peak)


class NanoGptTorchSide:
    """nanoGPT's model trained in PyTorch: forward, masked cross-entropy, backward, SGD step, per batch."""

    def __init__(self, setting: Setting, records: dict, threads: int):
        import torch

        from benchmarks.harness import nanogpt_torch

        torch.set_num_threads(threads)
        torch.manual_seed(reference.SEED)
        self.global_batch_size = setting.global_batch_size
        self.sizes = sizes(setting, records)
        s = self.sizes
        self.model = nanogpt_torch.GPT(s["vocab_size"], s["layers"], s["heads"], s["width"], s["context"])
        self.model.train()
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=reference.LEARNING_RATE, momentum=reference.MOMENTUM
        )
        tokens, lengths = lm.memory_batches(setting, records["train"])
        (ids, _), targets, mask = lm.keras_batches(tokens, lengths)
        self.batches = [
            (torch.from_numpy(i).long(), torch.from_numpy(t).long(), torch.from_numpy(m))
            for i, t, m in zip(ids, targets, mask, strict=True)
        ]
        self.next_batch = 0

    def step(self):
        """One training step on the next batch; returns the loss (a tensor)."""
        ids, targets, mask = self.batches[self.next_batch % len(self.batches)]
        self.next_batch += 1
        loss = self.model.loss(ids, targets, mask)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss

    def window(self, steps: int) -> tuple[float, int]:
        start = time.perf_counter()
        for _ in range(steps):
            loss = self.step()
        float(loss.detach())  # eager on the CPU: every step has run already
        return time.perf_counter() - start, steps * self.global_batch_size

    def stats(self) -> dict:
        parameters = sum(p.numel() for p in self.model.parameters())  # the tied head counted once
        return stats(self.sizes, parameters, mfu.torch_peak)

    def close(self) -> None:
        pass


def make_side(side: Side, setting: Setting, records: dict):
    """A peer side of `setting`: "keras_hub_fit" or "nanogpt_torch".

    Raises:
      ValueError: another kind, or a nanoGPT side asked for more than one device (it is one process).
    """
    if side.kind == "keras_hub_fit":
        return KerasHubFitSide(setting, records, side.towers, side.steps_per_execution, side.keras_accuracy)
    if side.kind == "nanogpt_torch" and side.towers == 1:
        # one thread per core, PyTorch's default on a machine of its own; or the side's intra-op threads
        return NanoGptTorchSide(setting, records, side.intra_op_threads or len(os.sched_getaffinity(0)))
    raise ValueError(f"no peer side {side.kind!r} on {side.towers} device(s): keras_hub_fit, or nanogpt_torch on 1")
