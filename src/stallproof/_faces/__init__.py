"""Faces: other libraries' APIs with stallproof's engine under them.

The rule of this package: a face adapts, it never bounds. Every bound, retry, breaker,
pacer, registry entry and span comes from the `Engine` it sends through; a face only
translates requests in and responses, errors and settings out, in the shape the caller's
library expects. The public faces are `stallproof.openai` and `stallproof.anthropic`
(SDK subclasses) and the transports re-exported by `stallproof`.

Sync faces hand their work to one event loop in a daemon thread (`_engine_loop`), where
the engine runs as it does for async callers: the sync adapters reuse the async ones'
translation, and no bound is written twice.

================= ========================================================"""
