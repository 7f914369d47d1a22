"""The one error a bad model directory raises; torch-free, so the tokenizer and chat template
loaders (which the router uses too) can raise it without importing torch."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The model directory is missing, incomplete or does not match the architecture."""
