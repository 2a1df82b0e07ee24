"""``fault-server`` / ``python -m fault_server``: run the fault server from a shell.

``fault-server [--port 8000]`` serves made-up answers; ``fault-server proxy --upstream URL``
forwards to a real OpenAI-compatible server and injects the faults into its answers.

The first line of stdout is the ``/v1`` base URL (flushed at once, so a script can read it
and go), the second the never-accepting listener's URL, then (with ``--tls``) the HTTPS
URL, and last the refused port's URL. Serves until SIGINT or SIGTERM.
Holding many connections needs file descriptors: the soft RLIMIT_NOFILE is raised to the
hard limit at start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import textwrap
from collections.abc import Sequence

from ._control_api import catalogue
from ._log_sink import StderrSink
from ._proxy_recording import RecordingError
from ._server import MAX_CONNECTIONS, FaultServer, is_loopback

__all__ = ["MODES", "TOKEN_ENV", "main"]

MODES = ("serve", "proxy")
TOKEN_ENV = "FAULT_SERVER_CONTROL_TOKEN"


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
        "mode",
        nargs="?",
        choices=MODES,
        default="serve",
        help="serve: made-up answers (the default); proxy: forward to --upstream, a real "
        "OpenAI-compatible server, and inject the faults into its answers. "
        "Flags may come before or after it.",
    )
    parser.add_argument(
        "--upstream",
        default=None,
        help="base URL of the real server, with /v1 (proxy mode; required by it)",
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
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also serve HTTPS on another port, self-signed (its URL is the third line)",
    )
    parser.add_argument(
        "--record", metavar="FILE", help="proxy mode: write the upstream's answers to FILE"
    )
    parser.add_argument(
        "--replay", metavar="FILE", help="serve the answers recorded in FILE (by --record)"
    )
    parser.add_argument(
        "--replay-speed",
        type=float,
        metavar="X",
        help="with --replay: serve the answers with their recorded timing, X times faster "
        "(1 as recorded); without it, as fast as the faults take them",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        help="most connections served at once; more wait in the backlog (default: %(default)s)",
    )
    parser.add_argument(
        "--control-token",
        default=os.environ.get(TOKEN_ENV),
        help=f"require this token on the /_fault/ control API (default: ${TOKEN_ENV}, which "
        "keeps it out of the process list)",
    )
    parser.add_argument(
        "--fixtures",
        metavar="FILE",
        help="canned answers for the requests that match (JSON; see docs/fault_control.md)",
    )
    parser.add_argument(
        "--insecure-open-control",
        action="store_true",
        help="bind beyond loopback WITHOUT a control token: anyone who can reach the port "
        "can arm faults and read the journal (refused without this flag)",
    )
    parser.add_argument("--list", action="store_true", help="print the fault catalogue and exit")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.mode == "proxy" and args.upstream is None:
        parser.error("proxy mode needs --upstream URL")
    if args.list:
        print(_format_catalogue())
        return 0
    open_control = args.control_token is None and not is_loopback(args.host)
    if open_control and not args.insecure_open_control:
        parser.error(
            f"binding {args.host}, which is not loopback, needs --control-token (or "
            f"${TOKEN_ENV}): without one, anyone who can reach the port can arm faults "
            "and read the journal; --insecure-open-control accepts that"
        )
    sink = _log_to_stderr()
    if not is_loopback(args.host):
        sink.write(
            f"fault-server: WARNING: binding {args.host}, which is not loopback: anyone who can "
            "reach it can hold connections open on this machine"
            + (
                ", AND ARM FAULTS, CHANGE THE MIX AND READ THE JOURNAL: the control API has "
                "no token (--insecure-open-control)"
                if open_control
                else "; the control API needs the token"
            )
        )
    try:
        server = FaultServer(
            host=args.host,
            port=args.port,
            max_hold=args.max_hold,
            upstream=args.upstream,
            tls=args.tls,
            record=args.record,
            replay=args.replay,
            max_connections=args.max_connections,
            control_token=args.control_token,
            fixtures=args.fixtures,
            insecure_open_control=args.insecure_open_control,
            replay_speed=args.replay_speed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    raise_fd_limit()
    try:
        asyncio.run(_serve(server, sink, args.tls))
    except OSError as exc:
        sink.write(f"fault-server: cannot listen on {args.host}:{args.port}: {exc}")
        return 1
    except RecordingError as exc:
        sink.write(f"fault-server: {exc}")
        return 1
    except KeyboardInterrupt:  # where signal handlers cannot be installed.
        pass
    finally:
        logging.getLogger().removeHandler(sink)
        sink.close()
    return 0


def _log_to_stderr() -> StderrSink:
    """Send warnings (the server's, asyncio's, Python's) to stderr through a `StderrSink`,
    so that a full stderr pipe never blocks the server."""
    sink = StderrSink()
    sink.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(sink)
    root.setLevel(logging.WARNING)
    logging.captureWarnings(True)
    return sink


async def _serve(server: FaultServer, sink: StderrSink, tls: bool = False) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    await server.start()
    try:
        print(f"{server.base_url}/v1", flush=True)
        print(server.blackhole_url, flush=True)
        if tls:
            print(server.tls_url(), flush=True)
            sink.write(f"fault-server: TLS certificate to trust: {server.tls_cert}")
        print(server.refused_url, flush=True)  # last: the lines before keep their places.
        mode = f"proxying {server.upstream}" if server.upstream else "serving"
        sink.write(f"fault-server: {mode}; Ctrl-C to stop; --list for faults")
        await stop.wait()
    finally:
        await server.aclose()


def raise_fd_limit() -> int | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (each held connection is an fd).

    Returns the new soft limit, or None where it cannot be read or changed.
    """
    try:
        import resource
    except ImportError:  # not on this platform.
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (OSError, ValueError):
        return None
    return int(soft)


def _format_catalogue() -> str:
    data = catalogue()
    faults = len(data["faults"]) - 1  # healthy is the absence of a fault.
    lines: list[str] = [f"{faults} faults, and healthy:"]

    def params(items: list[dict[str, object]]) -> None:
        for p in items:
            lines.append(f"    {p['name']}={p['default']!s}  ({p['type']}) {p['help']}")

    for fault in data["faults"]:
        scope = (
            " (connection level: arm it with a scenario)" if fault["scope"] == "connection" else ""
        )
        lines.append(f"{fault['name']}  [{fault['group']}]{scope}")
        lines.extend(
            textwrap.wrap(fault["description"], 88, initial_indent="  ", subsequent_indent="  ")
        )
        params(fault["params"])
    lines.append("generic parameters (any fault):")
    params(data["generic_params"])
    return "\n".join(lines)
