"""What moves between devices and machines: variables owned across the towers (`spread`), large variables
kept on every machine (`mirrors`), transfers fused into one buffer per device pair (`fused_buffers`), and the
bytes a step sends, counted from its graph (`traffic`)."""
