"""Helpers every test group shares: what a test needs to drive, time and check a client.

- `timing`: `MARGIN`, `stopwatch`, `wait_until` (poll, never a fixed sleep), `SentClock` (a
  call timed from where the engine takes it), `engine_of`.
- `memory`: `Peak` (the heap's peak growth in a block), `freeze_heap` (the session freezes
  its heap after collection: full GC passes skip it).
- `clients`: `KEY`, `warm`, `complete`, pool checks (`pool_state`, `assert_pool_clean`),
  `spying_client` (what went on the wire, through an ``http_client`` event hook).
- `rawserver`: a socket server answering with exact bytes, for malformed answers.
- `wire`: raw HTTP/1.1 over sockets to a fault server, and the CLI server in a subprocess
  (or `journal_server.py`, a server whose journal starts full).
- `sdk_catalogue`: the fault catalogue as the SDK faces meet it (shared by their tests).
- `proxyserver`: a forward/CONNECT/SOCKS5 proxy on loopback.
- `fleet`: a real redis-server and worker processes (`fleet_worker.py`) for fleet state.
- `otel`: OpenTelemetry attributes and metric points, read with their kind asserted.
- `soak`: the chaos soak (random faults, totals, cancellations through every face; its
  parts `soak_plan`, `soak_calls`, `soak_report`), for test_soak.py and benchmarks/soak.py.

Fixtures live in the conftest.py of the group that uses them (tests/conftest.py for all).
"""
