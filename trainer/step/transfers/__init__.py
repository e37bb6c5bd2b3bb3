"""What moves between machines: large variables kept on every machine (`mirrors`), transfers fused into one
buffer per device pair (`fused_buffers`), and the bytes a step sends per device, counted from its graph
(`traffic`). Where each variable lives is the core's (`trainer.step.core.spread`)."""
