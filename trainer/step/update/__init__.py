"""The optimizer update: the one update both modes apply (`apply`: clip, optimizer, statistics, step + 1),
each variable's part on its owner's device (`per_device`), sgd and momentum as one fused kernel per variable
(`fused_kernels`), and the optimizers and their schedules (`optimizers`)."""
