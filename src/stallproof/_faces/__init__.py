"""Faces: other libraries' APIs with stallproof's engine under them.

The rule of this package: a face adapts, it never bounds. Every bound, retry, breaker,
pacer, registry entry and span comes from the `Engine` it sends through; a face only
translates requests in and responses, errors and settings out, in the shape the caller's
library expects. The public faces are `stallproof.openai` and `stallproof.anthropic`
(SDK subclasses) and the transports re-exported by `stallproof`.

Sync faces hand their work to one event loop in a daemon thread (`_engine_loop`), where
the engine runs as it does for async callers: the sync adapters reuse the async ones'
translation, and no bound is written twice.

================= ===============================================================
module            what is in it
================= ===============================================================
`_transport`      `AsyncTransport` (httpx) and `AsyncTransport2` (httpx2): the engine
                  as an httpx transport; `http_client()`, `http_client2()`; the
                  request/response translation the sync adapters share
`_sync_transport` `Transport` (httpx) and `Transport2` (httpx2): the engine as a sync
                  transport, through the engine loop; `sync_http_client()`,
                  `sync_http_client2()`
`_engine_loop`    `EngineLoop`: the process's one event loop in a daemon thread that
                  sync calls hand work to (context, cancellation, exit, fork)
`_arguments`      the SDK constructor's own arguments (``base_url``, keys, default
                  headers and query) checked before the SDK sees them
`_sdk`            what the SDK faces share: `harden` (the engine under an SDK
                  client), `FaceMixin`, `TranslatingDecoder` (mid-stream errors as
                  the SDK's own classes)
`_sync_sdk`       `SyncFaceMixin`: a sync SDK face's views, read on the engine loop
`_own_client`     a caller's own httpx/httpx2 client kept under a face
`_compat`         the SDKs' fragile details, whatever major is installed: the HTTP
                  library each runs on (httpx or httpx2), their ``timeout=`` and
                  ``max_retries=`` in our terms; used by every face and `Client`
`_streams`        an SDK stream without a reference cycle: dropped, freed at once
`_typed`          every failure typed where an SDK parses: bodies (``json()``),
                  stream events, and results with required parts missing
================= ===============================================================
"""
