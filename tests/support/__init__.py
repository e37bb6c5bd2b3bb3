"""What the tests share: the repository's root, running the trainer, the flags of a CPU run, fixtures and
helpers. Nothing here imports benchmarks/."""
