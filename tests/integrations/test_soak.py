"""The chaos soak at a size CI affords: a few hundred calls, random faults, totals and
cancellations, through every face at once, on asyncio and trio (tests/support/soak.py;
benchmarks/soak.py runs the same at 20,000 calls).

Every call must end typed or cancelled as asked (no untyped error), by its deadline plus
the watchdog's guard (no hang), and leave nothing behind: no pool slot, pacer permit, file
descriptor or task, and nothing raised where no caller can catch it.

Lateness is judged against the event loop's own lag, measured beside the calls: a call
late while the loop itself was held up (a loaded runner, a full garbage collection, the
in-process fault server's thread holding the GIL) is late by the machine. A call late by
more than MARGIN past all the lag the loop showed between its deadline and its end fails;
so do more than 5% of the calls late by 100 ms past the loop's longest single stall there
(a bound 0.2 s late makes that ~13%; a quiet run has 0-1%).

Each run draws a new seed, printed in the failure message; replay one with
``STALLPROOF_SOAK_SEED=<seed>``.
"""

from __future__ import annotations

import dataclasses
import os
import random
from urllib.parse import urlsplit

import pytest

import fault_server as fault_servers

from ..support import soak
from ..support.timing import MARGIN

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    # trio finalises a stream's generator a caller left unexhausted (a stream closed after
    # a few events, a cancelled read) and warns that `aclosing` would be tidier; what it
    # held is released either way, and the soak checks that.
    pytest.mark.filterwarnings("ignore:Async generator .* was garbage collected:ResourceWarning"),
]

SETTINGS = soak.Settings(
    calls=400,
    seed=0,
    concurrency=32,
    totals=(0.2, 1.2),
    cancel=0.1,
    guard=3.0,
    hold=5.0,
    threads=8,
    limit=60.0,
)
# At most this share of the calls may end more than LATE past their deadline and past the
# loop's longest stall around it: a loop every turn of which is slow (a saturated runner)
# delays a few that way, a regression of 0.2 s delays more than one call in ten.
LATE, LATE_SHARE = 0.1, 0.05


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


async def test_the_chaos_soak_ends_every_call_typed_on_time_and_leaves_nothing(
    anyio_backend: str,
) -> None:
    seed = int(os.environ.get("STALLPROOF_SOAK_SEED", random.randrange(1_000_000)))
    settings = dataclasses.replace(SETTINGS, seed=seed)
    # A fault server of its own, stopped at the end: the faults its calls left held (up to
    # `hold`) end with it, instead of keeping the session's server, and the GIL of this
    # test process, busy under the timed tests that come next.
    with fault_servers.running(port=0, max_hold=SETTINGS.hold + 1) as server:
        targets = soak.Targets(server.url(), server.blackhole_url, server.refused_url)
        ports = frozenset({server.port, _port(server.blackhole_url)})
        report = await soak.run(settings, targets, server_ports=ports)
    failures = report.failures(
        late_after=LATE, late_share=LATE_SHARE, beyond_lag=MARGIN, against_loop=True
    )
    assert not failures, (
        f"{report.summary()} (replay: STALLPROOF_SOAK_SEED={seed})\n"
        + "\n".join(failures[:30])
        + f"\n{report.table()}"
    )
    # The mix really ran: every outcome a soak must see, on every face.
    for outcome in (soak.SUCCESS, soak.TYPED, soak.CANCELLED):
        assert report.count(outcome) > 0, (outcome, report.table())
    assert {r.plan.face for r in report.results} == set(soak.FACES)
