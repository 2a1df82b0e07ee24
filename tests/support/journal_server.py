"""A fault server, in a process of its own, whose journal starts full (for test_journal.py).

Usage: ``python journal_server.py --port 0 --requests N --keys K`` (through
`tests.support.wire.cli_server`, which passes ``--port 0`` as to ``fault-server``). It
journals ``N`` requests (404s to ``GET /v1/nope``, keys ``k0``...``k{K-1}`` in turn, 1,000
to a connection) straight into the server's state, as the server records a request it
serves, prints its URL (with /v1) as ``fault-server`` does, then serves until SIGTERM.
Filling 50,000 requests over sockets costs the server ~7 s of CPU parsing them; in place,
0.2 s.
"""

from __future__ import annotations

import argparse
import signal
from types import FrameType

import fault_server

PER_CONNECTION = 1000


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--keys", type=int, required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    with fault_server.running(port=args.port) as srv:
        journal = srv.server._state.journal
        for start in range(0, args.requests, PER_CONNECTION):
            conn = journal.open(f"127.0.0.1:{10000 + start // PER_CONNECTION}")
            for i in range(start, min(args.requests, start + PER_CONNECTION)):
                log = conn.request("GET", "/v1/nope")
                log.key = f"k{i % args.keys}"
                log.status = 404
                conn.end_request(log, "complete")
            conn.close("server", "done")  # the last asked to close
        print(srv.base_url + "/v1", flush=True)
        while True:
            signal.pause()


if __name__ == "__main__":
    main()
