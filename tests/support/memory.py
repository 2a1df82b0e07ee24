"""Memory in tests: the Python heap's peak growth while a block runs (tracemalloc)."""

from __future__ import annotations

import tracemalloc

__all__ = ["MiB", "Peak"]

MiB = 1024 * 1024


class Peak:
    """Python heap growth while the block runs (tracemalloc), in bytes: ``peak``."""

    def __enter__(self) -> Peak:
        tracemalloc.start()
        tracemalloc.reset_peak()
        self.base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = tracemalloc.get_traced_memory()[1] - self.base
        tracemalloc.stop()
