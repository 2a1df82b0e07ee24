"""``fault-server`` / ``python -m fault_server``: run the fault server from a shell.

The first line of stdout is the ``/v1`` base URL (flushed at once, so a script can read it
and go), the second the never-accepting listener's URL. Serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import sys
import textwrap
from collections.abc import Sequence

from ._control import catalogue
from ._server import FaultServer

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, then list the faults or serve until a signal. Returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="fault-server",
        description="An OpenAI-compatible server that misbehaves on request.",
        epilog="Select a fault with a base_url like "
        "http://127.0.0.1:8000/fault/trickle_body;interval=0.5/v1 or an "
        "'X-Fault: name;k=v' header. See --list.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port to bind, 0 for any free one (default: %(default)s)",
    )
    parser.add_argument(
        "--max-hold",
        type=float,
        default=30.0,
        help="most seconds any fault keeps a connection (default: %(default)s)",
    )
    parser.add_argument("--list", action="store_true", help="print the fault catalogue and exit")
    args = parser.parse_args(argv)
    if args.list:
        print(_format_catalogue())
        return 0
    if not _is_loopback(args.host):
        print(
            f"fault-server: warning: binding {args.host}, which is not loopback: anyone who can "
            "reach it can hold connections open on this machine",
            file=sys.stderr,
        )
    try:
        server = FaultServer(host=args.host, port=args.port, max_hold=args.max_hold)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(_serve(server))
    except OSError as exc:
        print(f"fault-server: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # where signal handlers cannot be installed.
        pass
    return 0


async def _serve(server: FaultServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    await server.start()
    try:
        print(f"{server.base_url}/v1", flush=True)
        print(server.blackhole_url, flush=True)
        print("fault-server: serving; Ctrl-C to stop; --list for faults", file=sys.stderr)
        await stop.wait()
    finally:
        await server.aclose()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _format_catalogue() -> str:
    data = catalogue()
    lines: list[str] = []

    def params(items: list[dict[str, object]]) -> None:
        for p in items:
            lines.append(f"    {p['name']}={p['default']!s}  ({p['type']}) {p['help']}")

    for fault in data["faults"]:
        lines.append(fault["name"])
        lines.extend(
            textwrap.wrap(fault["description"], 88, initial_indent="  ", subsequent_indent="  ")
        )
        params(fault["params"])
    lines.append("generic parameters (any fault):")
    params(data["generic_params"])
    return "\n".join(lines)
