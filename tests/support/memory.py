"""Memory in tests: the Python heap's peak growth while a block runs (tracemalloc), and the
heap frozen out of the cyclic collector's full passes (`freeze_heap`)."""

from __future__ import annotations

import gc
import tracemalloc

__all__ = ["MiB", "Peak", "freeze_heap"]

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


def freeze_heap() -> None:
    """Collect, then freeze what is left (`gc.freeze`), as a latency-minded service does
    after start-up: the collector's full passes skip it from then on.

    A test process's heap (pytest, 2,500 collected tests, every test module, both SDKs'
    types) is many times a service's: each full pass over it costs ~0.15 s of CPU, and the
    collector makes one whenever a test's objects have grown the survivors by a quarter;
    frozen, a worker spent a sixth of the time collecting. The session freezes its heap
    once its tests are collected (tests/conftest.py); a test that a full pass would delay
    freezes again what earlier tests left. Nothing unfreezes (that would thaw the session's
    heap too): a frozen object is still freed by its reference count, only a cycle it joins
    later stays until the process ends.
    """
    gc.collect()
    gc.freeze()
