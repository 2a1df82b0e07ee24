"""What hostile bodies cost the client: SSE decoding, compression bombs, deep JSON.

Ratios, measured in one run, so the machine's speed cancels out:

- SSE: a 1 MiB line fed in 64-byte pieces vs fed in one piece (linear decoding: ~1-3x;
  the quadratic decoder this replaced: ~1000x, 55 s);
- bombs: decoding a 256 MiB bomb of each encoding against the default 32 MiB cap: time
  and tracemalloc peak (the cap bounds both);
- JSON: the depth check vs ``json.loads`` on a 3 MB body of a million empty objects.

    python benchmarks/hostile_bodies.py
"""

from __future__ import annotations

import json
import time
import tracemalloc
import zlib
from collections.abc import Callable

from stallproof._decoding import ContentDecoder, TooLarge
from stallproof._json import too_deep
from stallproof._sse import SSEDecoder

MiB = 1024 * 1024


def _best(fn: Callable[[], object], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def sse() -> None:
    line = b"data: " + b"x" * MiB + b"\n\n"

    def pieces() -> None:
        d = SSEDecoder(2 * MiB)
        for i in range(0, len(line), 64):
            list(d.feed(line[i : i + 64]))

    def whole() -> None:
        list(SSEDecoder(2 * MiB).feed(line))

    small, one = _best(pieces), _best(whole)
    print(f"sse: 1 MiB line in 64 B pieces {small * 1e3:.1f} ms, in one piece {one * 1e3:.2f} ms")


def bombs() -> None:
    parts = [b"\0" * MiB] * 256
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    encoded = {"gzip": b"".join(c.compress(p) for p in parts) + c.flush()}
    try:
        import brotli

        b = brotli.Compressor(quality=5)
        encoded["br"] = b"".join(b.process(p) for p in parts) + b.finish()
    except ImportError:
        pass
    try:
        import zstandard

        z = zstandard.ZstdCompressor().compressobj()
        encoded["zstd"] = b"".join(z.compress(p) for p in parts) + z.flush()
    except ImportError:
        pass
    for name, body in encoded.items():
        tracemalloc.start()
        start = time.perf_counter()
        decoder = ContentDecoder([name], 32 * MiB)
        try:
            for i in range(0, len(body), 65536):
                for _ in decoder.feed(body[i : i + 65536]):
                    pass
        except TooLarge:
            pass
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(
            f"bomb {name}: {len(body)} B on the wire -> stopped at the 32 MiB cap in "
            f"{took * 1e3:.0f} ms, peak {peak / MiB:.1f} MiB"
        )


def deep_json() -> None:
    body = b'{"choices":[' + b",".join([b"{}"] * 1_000_000) + b"]}"
    check = _best(lambda: too_deep(body))
    parse = _best(lambda: json.loads(body), runs=1)
    print(f"json: depth check {check * 1e3:.0f} ms vs json.loads {parse * 1e3:.0f} ms (3 MB)")


if __name__ == "__main__":
    sse()
    bombs()
    deep_json()
