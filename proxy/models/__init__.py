"""What the proxy knows of a model: its window and max output (the config's overrides, then
litellm's model map), its token counter, and that counter's calibration against the
upstream's own counts."""
