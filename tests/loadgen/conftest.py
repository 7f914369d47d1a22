"""The worker tests' seeded `tiny` model, for replays against a real worker."""

from tests.worker.conftest import tiny_dir

__all__ = ["tiny_dir"]
