"""The pipeline's one error type."""
from __future__ import annotations


class PipelineError(RuntimeError):
    """A run that cannot proceed; the message names the experiment, trial or file."""


__all__ = ["PipelineError"]
