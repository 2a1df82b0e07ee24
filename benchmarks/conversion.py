"""Cost of turning one parsed JSON object into a typed result, per chunk and per completion.

stallproof validates into openai's own pydantic types (`stallproof._results.to_result`,
strict pydantic-core validation); the openai SDK builds the same types without validation
(``openai._models.construct_type``). With ``--old-models FILE`` the hand-written models
stallproof used before (``git show 6dd2a5e:src/stallproof/_models.py > FILE``) are timed
too, so the change is measured in one run on one machine.

    python benchmarks/conversion.py [--old-models /tmp/old_models.py] [--seconds 0.5]

Each timing is the best of 5 repeats of a loop bounded in count and time.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import time
from collections.abc import Callable
from typing import Any

from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from stallproof._results import to_result


def _chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return {
        "id": "chatcmpl-0123456789",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_0123",
        "choices": [choice],
        **extra,
    }


SHAPES: dict[str, tuple[type[Any], dict[str, Any]]] = {
    "chunk: content delta": (ChatCompletionChunk, _chunk({"content": " lorem"})),
    "chunk: tool-call delta": (
        ChatCompletionChunk,
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}),
    ),
    "chunk: usage": (
        ChatCompletionChunk,
        {
            **_chunk({}),
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52},
        },
    ),
    "completion: text + usage": (
        ChatCompletion,
        {
            "id": "chatcmpl-0123456789",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "lorem " * 40, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52},
        },
    ),
}


def per_call(fn: Callable[[], object], seconds: float, max_calls: int = 200_000) -> float:
    """Best of 5 of the mean time per call, each repeat bounded by count and time."""
    best = float("inf")
    for _ in range(5):
        n, start = 0, time.perf_counter()
        deadline = start + seconds / 5
        while n < max_calls:
            for _ in range(100):
                fn()
            n += 100
            if time.perf_counter() >= deadline:
                break
        best = min(best, (time.perf_counter() - start) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--old-models", help="stallproof's old _models.py, to time as well")
    parser.add_argument("--seconds", type=float, default=0.5, help="per measurement")
    args = parser.parse_args()
    old: Any = None
    if args.old_models:
        spec = importlib.util.spec_from_file_location("stallproof._old_models", args.old_models)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = old  # dataclasses look their module up
        spec.loader.exec_module(old)
    header = f"{'shape':<26} {'stallproof':>11} {'openai SDK':>11}"
    header += f" {'old models':>11}" if old else ""
    print(header + "   (µs per object; stallproof validates, the SDK does not)")
    for name, (cls, data) in SHAPES.items():
        ours = per_call(functools.partial(to_result, cls, data), args.seconds)
        sdk = per_call(functools.partial(construct_type, type_=cls, value=data), args.seconds)
        row = f"{name:<26} {ours * 1e6:>11.2f} {sdk * 1e6:>11.2f}"
        if old is not None:
            before = getattr(old, cls.__name__)
            prior = per_call(functools.partial(before.from_dict, data), args.seconds)
            row += f" {prior * 1e6:>11.2f}"
        print(row)


if __name__ == "__main__":
    main()
