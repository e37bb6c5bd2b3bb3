"""Rows of the flag table (`trainer.settings.table`) for what is trained: towers, data, augmentation, model,
optimizer."""

from __future__ import annotations

import math

from trainer.settings import config as cfg
from trainer.settings.flag import FREE, Flag, at_least, floats, in_range, ints, positive

SEED_LIMIT = 2**32 - 1


def towers() -> list[Flag]:
    g = "towers"
    return [
        Flag(
            "num_gpus",
            "towers.num_towers",
            g,
            "Towers per task (at least 1): one per device (GPU, or logical CPU with --device=cpu).",
            check=at_least(1),
        ),
        Flag(
            "device",
            "towers.device",
            g,
            "Tower device kind. gpu: /gpu:0..N-1, exits at once if fewer GPUs are "
            "visible. cpu: N logical CPU devices (the same code path, for machines without GPUs).",
            FREE,
            cfg.DEVICE_KINDS,
        ),
        Flag(
            "parameter_device",
            "towers.parameter_device",
            g,
            "Where the single copy of the variables and optimizer "
            "slots lives. gpu: the first tower's device (/cpu:0 with --device=cpu). cpu: the host. spread: each "
            "variable and its slots on one tower's device, balanced by bytes; same weights bitwise, less traffic "
            "through any one device.",
            FREE,
            cfg.PARAMETER_DEVICES,
        ),
        Flag(
            "global_batch_size",
            "towers.global_batch_size",
            g,
            "Examples per step, over all towers (split into micro-batches).",
            check=at_least(1),
        ),
        Flag(
            "micro_batches",
            "towers.micro_batches",
            g,
            "K micro-batches per step, a multiple of --num_gpus dividing "
            "the batch; 0: one per tower. Fix K to make results independent of --num_gpus.",
        ),
        Flag(
            "update_mode",
            "towers.update_mode",
            g,
            "sync: the K gradients are averaged in a fixed order, then one "
            "update per step. async: each tower applies its own micro-batch gradient at once, no barrier; one step = "
            "one update of --global_batch_size/--micro_batches examples, at --learning_rate/--micro_batches, with "
            "momentum lowered to 1-N(1-momentum) for the momentum asynchrony adds. Async is NOT deterministic.",
            choices=cfg.UPDATE_MODES,
        ),
        Flag(
            "max_staleness",
            "towers.max_staleness",
            g,
            "Async: a tower waits rather than apply an update staler "
            "than this (updates applied by other towers since it read the variables); 0 is lock-step, negative is "
            "unbounded.",
        ),
        Flag(
            "xla",
            "towers.jit_compile",
            g,
            "XLA-compile the training step (jit_compile). On GPUs it fuses "
            "element-wise ops; measured effect in benchmarks/results/headline.md.",
            FREE,
        ),
        Flag(
            "mixed_precision",
            "towers.mixed_precision",
            g,
            "Compute in bfloat16 or float16, variables in float32; fp16 adds dynamic loss scaling. Empty: float32.",
            choices=cfg.MIXED_PRECISION,
        ),
        Flag(
            "fuse_transfers",
            "towers.fuse_transfers",
            g,
            "Sync, several tasks: what one device sends one device of another task in a step (variable values, "
            "partial gradient sums) goes as one flat buffer per dtype instead of one tensor each (tensor fusion). "
            "Same weights bitwise; measured in benchmarks/results/machines.md (Fusion).",
            FREE,
        ),
        Flag(
            "seed",
            "seed",
            g,
            "Seed of weight init, data shuffle and Dropout: 0 .. 2**32-1 (what Keras's set_random_seed takes).",
            check=in_range(0, SEED_LIMIT, "Keras's set_random_seed seeds numpy, whose seeds are 32-bit"),
        ),
        Flag(
            "deterministic",
            "deterministic",
            g,
            "Bitwise reproducible training (sync mode): the same weights on a "
            "rerun, for every --num_gpus dividing --micro_batches, and after resume. Costs some speed.",
        ),
    ]


def data_() -> list[Flag]:
    g = "data"
    return [
        Flag(
            "train_data",
            "data.train_data",
            g,
            "Glob(s), comma-separated, of training TFRecords. Empty: the "
            "built-in UCI digits (data/digits.csv.gz, built once into ~/.cache/towerflow or $TOWERFLOW_CACHE).",
        ),
        Flag("eval_data", "data.eval_data", g, "Glob(s) of held-out TFRecords; required with --train_data.", FREE),
        Flag(
            "record_schema",
            "data.record_schema",
            g,
            "image: ImageNet-script keys (image/encoded, "
            "image/class/label). dense: a float vector (--feature_key) and an int64 label (--label_key). auto: "
            "decided by the first record.",
            choices=cfg.RECORD_SCHEMAS,
        ),
        Flag("num_classes", "data.num_classes", g, "Number of classes; required with --train_data (10 for digits)."),
        Flag(
            "label_offset",
            "data.label_offset",
            g,
            "Subtracted from every label (1 for ImageNet, whose labels start at 1).",
        ),
        Flag(
            "image_size",
            "data.image_size",
            g,
            "H,W to resize every image to; needed when images differ in size.",
            check=lambda v: "" if v is None or (len(v) == 2 and min(v) >= 1) else "must be two positive integers H,W",
            parse=ints(2, "two positive integers H,W"),
        ),
        Flag("feature_key", "data.feature_key", g, "Dense records: key of the float feature vector."),
        Flag("label_key", "data.label_key", g, "Dense records: key of the int64 label."),
        Flag(
            "shuffle_buffer",
            "data.shuffle_buffer",
            g,
            "Records in the shuffle buffer, at least 1 (1: file order); saved in every checkpoint.",
            check=at_least(1),
        ),
        Flag(
            "eval_batch_size",
            "data.eval_batch_size",
            g,
            "Examples per eval batch; 0: --global_batch_size.",
            FREE,
            check=at_least(0),
        ),
        Flag(
            "max_bad_records",
            "data.max_bad_records",
            g,
            "Corrupt training records (bad CRC, truncated file) to "
            "skip before failing (0: the first fails the run), each with the rest of its file, which the reader "
            "cannot resynchronise on; each is named on stderr once. A record that does not parse or decode, a "
            "label outside [0, --num_classes) and any bad eval record always fail the run.",
            FREE,
            check=at_least(0),
        ),
    ]


def augmentation() -> list[Flag]:
    g = "augmentation"
    return [
        Flag(
            "augment",
            "data.augment",
            g,
            "Training-image augmentation, random but keyed on each example's position "
            "in the run, so --deterministic still holds. flip: horizontal flip. crop_flip: pad H/8 (4 px at 32x32), "
            "random crop, flip. imagenet: random-resized crop (area 8-100%, aspect 3/4-4/3; a JPEG decodes only the "
            "crop) to the image size, flip; eval takes the central 87.5%. auto: crop_flip for resnet20, imagenet "
            "for resnet50, none otherwise (flipped digits change meaning) and for dense records.",
            choices=cfg.AUGMENTS,
        ),
        Flag(
            "normalize",
            "data.normalize",
            g,
            "Per-channel normalization of [0, 1] pixels, after augmentation, in "
            "training, eval and the exported SavedModel: none, imagenet (ImageNet's RGB mean and std), or MEAN,STD "
            "as numbers: the means, then the stds, one per channel (0.49,0.48,0.45,0.25,0.24,0.26) or one for all "
            "(0.5,0.25).",
            parse=cfg.Normalization.parse,
        ),
        Flag(
            "cache",
            "data.cache",
            g,
            "memory: decode each training image once and keep it in memory (augmentation "
            "runs after the cache; same batches as none). auto: memory when the decoded training images take under "
            "2 GiB (estimated from the file sizes and the first record), else none. Dense records are never "
            "cached.",
            FREE,
            cfg.CACHES,
        ),
    ]


def model_and_optimizer() -> list[Flag]:
    g = "optimizer"
    return [
        Flag(
            "model",
            "model.name",
            "model",
            "The model of a task that trains one by name (the built-in classification task's): built-in (mlp, cnn, "
            "resnet20, resnet50) or 'package.module:function' returning a Keras model for (input_shape, num_classes).",
        ),
        Flag("optimizer", "optimizer.name", g, "Optimizer (momentum: SGD with --momentum).", choices=cfg.OPTIMIZERS),
        Flag(
            "learning_rate",
            "optimizer.learning_rate",
            g,
            "Peak learning rate (after warmup), per step of --global_batch_size examples.",
            check=positive,
        ),
        Flag("momentum", "optimizer.momentum", g, "Momentum of --optimizer=momentum, in [0, 1].", check=in_range(0, 1)),
        Flag(
            "weight_decay",
            "optimizer.weight_decay",
            g,
            "Decoupled weight decay of --optimizer=adamw, >= 0.",
            check=in_range(0, math.inf),
        ),
        Flag("beta2", "optimizer.beta2", g, "Adam's and AdamW's beta_2, in [0, 1).", check=in_range(0, 0.999999)),
        Flag(
            "lr_schedule",
            "optimizer.schedule",
            g,
            "cosine: linear warmup then cosine decay to --min_learning_rate at --train_steps. "
            "piecewise: --lr_values between --lr_boundaries. constant: warmup then --learning_rate.",
            choices=cfg.SCHEDULES,
        ),
        Flag(
            "warmup_steps",
            "optimizer.warmup_steps",
            g,
            "Steps of linear warmup from 0 (cosine and constant schedules); 0: none.",
        ),
        Flag(
            "min_learning_rate",
            "optimizer.min_learning_rate",
            g,
            "Where the cosine schedule ends, >= 0 and below --learning_rate (nanoGPT: a tenth of it).",
            check=in_range(0, math.inf),
        ),
        Flag(
            "lr_boundaries", "optimizer.boundaries", g, "Piecewise schedule: step boundaries, increasing.", parse=ints()
        ),
        Flag(
            "lr_values",
            "optimizer.values",
            g,
            "Piecewise schedule: learning rates, one more than boundaries.",
            parse=floats,
            check=lambda v: "" if all(math.isfinite(x) and x >= 0 for x in v) else "must be finite numbers >= 0",
        ),
        Flag(
            "clip_global_norm",
            "optimizer.clip_global_norm",
            g,
            "Clip the averaged gradient to this global norm; 0: no clipping.",
            check=in_range(0, math.inf, "0: no clipping"),
        ),
    ]
