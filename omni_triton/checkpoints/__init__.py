"""Tiny-checkpoint builders used by ``omni-triton prepare`` (and by the stages' ``checkpoint_dir``
on first use): random weights of the real architectures, saved with ``save_pretrained``."""
