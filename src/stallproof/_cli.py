"""``stallproof`` / ``python -m stallproof``: ``top`` and ``diagnose`` from a shell.

``stallproof top`` shows every call in flight across the fleet (`_top`);
``stallproof diagnose --base-url URL`` runs the four probes and says where it is stuck
(`_diagnose`). Exit status: 0 all is well (top: it ran; diagnose: healthy), 1 diagnose
found trouble, 2 the command could not run (bad input, an address that does not answer),
with a one-line message on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

from . import _exceptions as exc
from ._diagnose import DEFAULT_GAUGES, DiagnoseError, diagnose, render
from ._local_socket import socket_dir
from ._policies import RedisState
from ._top import Source, SourceError, fetch, run, snapshot_json
from ._top import render as render_top

__all__ = ["main"]

REDIS_ENV = "STALLPROOF_REDIS_URL"


class _Usage(Exception):
    """Bad arguments: the message says which."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``stallproof top`` or ``stallproof diagnose``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    # Redis trouble is reported by the command itself, not as the library's log lines;
    # the logger is left as it was found (``main`` may run inside another program).
    logger = logging.getLogger("stallproof")
    quiet, propagate = logging.NullHandler(), logger.propagate
    logger.addHandler(quiet)
    logger.propagate = False
    try:
        if args.command == "top":
            return _top(args)
        return _diagnose(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 0
    except (_Usage, DiagnoseError, SourceError, exc.InvalidRequestError) as e:
        print(f"stallproof {args.command}: {e}", file=sys.stderr)
        return 2
    finally:
        logger.removeHandler(quiet)
        logger.propagate = propagate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stallproof", description="Where are the LLM calls stuck? (docs/debugging.md)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    top = commands.add_parser(
        "top",
        help="every call in flight across the fleet, live",
        description="Every call in flight across the fleet, refreshed every second, what"
        " needs attention first. Processes publish their calls with"
        " stallproof.publish_inflight(RedisState(...)) or stallproof.serve_inflight().",
    )
    _sources(top)
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument(
        "--json", action="store_true", help="print one snapshot as JSON and exit (implies --once)"
    )
    top.add_argument(
        "--interval", type=float, default=1.0, help="seconds between redraws (default 1)"
    )

    diag = commands.add_parser(
        "diagnose",
        help="the four probes and a verdict: client stuck, server queueing, stalled...",
        description="Probe the fleet's calls, the server's running/waiting gauges and a fresh"
        " request, then say where it is stuck, with the numbers.",
    )
    diag.add_argument("--base-url", required=True, help="the server's base URL, with /v1")
    diag.add_argument(
        "--metrics",
        action="append",
        default=[],
        help="its Prometheus endpoint (default: /metrics at the base URL's origin); repeat"
        " for one per engine (prefill, decode...): their counts add up",
    )
    diag.add_argument(
        "--gauge",
        action="append",
        default=[],
        metavar="COUNT=NAME",
        help="read COUNT (running or waiting) from the gauge NAME (repeat for alternatives:"
        " the first present is read; default: vLLM's, then SGLang's)",
    )
    diag.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="the probe's key (default $OPENAI_API_KEY)",
    )
    diag.add_argument("--model", help="the probe's model (default: the first listed)")
    diag.add_argument(
        "--timeout",
        type=float,
        default=20.0,
        help="bound on each probe and on the probe's first token, seconds (default 20)",
    )
    diag.add_argument(
        "--slow-ttft",
        type=float,
        default=5.0,
        help="a first token slower than this is slow (default 5)",
    )
    diag.add_argument("--json", action="store_true", help="print the report as JSON")
    _sources(diag)
    return parser


def _sources(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis",
        default=os.environ.get(REDIS_ENV),
        help=f"read the fleet's calls from this Redis (default ${REDIS_ENV})",
    )
    parser.add_argument(
        "--prefix", default="stallproof", help="the RedisState prefix (default stallproof)"
    )
    parser.add_argument(
        "--op-timeout", type=float, default=2.0, help="bound on each Redis read (default 2)"
    )
    parser.add_argument(
        "--socket",
        action="append",
        default=[],
        help="read one process's calls from this socket (stallproof.serve_inflight)",
    )
    parser.add_argument(
        "--pid", type=int, action="append", default=[], help=f"the socket of PID in {socket_dir()}"
    )


def _source(args: argparse.Namespace) -> Source:
    sockets = (*args.socket, *(os.path.join(socket_dir(), f"{p}.sock") for p in args.pid))
    if args.redis and sockets:
        raise _Usage("give --redis or --socket/--pid, not both")
    redis = None
    if args.redis:
        redis = RedisState(args.redis, prefix=args.prefix, op_timeout=args.op_timeout)
    return Source(redis=redis, sockets=tuple(sockets), timeout=args.op_timeout)


def _top(args: argparse.Namespace) -> int:
    source = _source(args)
    if not 0.1 <= args.interval <= 3600:
        raise _Usage(f"--interval must be between 0.1 and 3600 seconds, got {args.interval}")
    if args.json or args.once:
        snap = asyncio.run(fetch(source))
        if args.json:
            print(json.dumps(snapshot_json(snap), indent=2))
        else:
            print(render_top(snap))
        return 0
    asyncio.run(run(source, interval=args.interval))
    return 0  # pragma: no cover - run returns only when cancelled


def _diagnose(args: argparse.Namespace) -> int:
    gauges = {k: list(v) for k, v in DEFAULT_GAUGES.items()}
    given: dict[str, list[str]] = {}
    for item in args.gauge:
        count, sep, name = item.partition("=")
        if not sep or count not in gauges or not name:
            raise _Usage(f"--gauge must be running=NAME or waiting=NAME, got {item!r}")
        given.setdefault(count, []).append(name)
    gauges.update(given)
    for name in ("timeout", "slow_ttft"):
        value = getattr(args, name)
        if not 0 < value <= 3600:
            raise _Usage(f"--{name.replace('_', '-')} must be > 0 and <= 3600, got {value}")
    source = _source(args)
    report = asyncio.run(
        diagnose(
            base_url=args.base_url,
            source=source,
            metrics=args.metrics,
            gauges=gauges,
            api_key=args.api_key,
            model=args.model,
            timeout=args.timeout,
            slow_ttft=args.slow_ttft,
        )
    )
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print(render(report))
    return 0 if report.verdict == "healthy" else 1
