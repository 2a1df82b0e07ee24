"""The ``/_fault/`` control API: stats, reset, catalogue, scenarios, mix, journal, verdicts.

Every change is atomic: the whole request is validated before anything changes, so a bad
one changes nothing and gets a 400 whose OpenAI-shaped error (``"code": "invalid_control"``)
says what is wrong. ``PUT`` and ``DELETE`` are idempotent; ``POST /_fault/scenarios`` is too
for rules that carry an ``id`` (a rule with a known id replaces the old one).

| route | does |
|---|---|
| ``GET /_fault/stats`` | counts, per key too |
| ``POST /_fault/reset`` | zero the counts and the journal; ``{"all": true}`` also disarms |
| ``GET /_fault/list`` | the catalogue |
| ``GET/PUT/POST/DELETE /_fault/scenarios`` | read, replace, add to, clear the rules |
| ``GET/PUT/DELETE /_fault/mix`` | read, set, clear the seeded mix |
| ``GET /_fault/journal`` | what each connection did, a page at a time |
| ``GET /_fault/verdict`` | how the client behaved |
| ``POST /_fault/forget`` | drop everything kept for a key |
| ``GET/PUT/POST/DELETE /_fault/fixtures`` | read, replace, add to, clear the fixtures |
| ``GET /metrics`` | Prometheus gauges (`_metrics`) |
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from ._fixtures import Fixture, fixtures_of
from ._json_depth import loads as loads_limited
from ._metrics import PATH as METRICS
from ._metrics import exposition
from ._mix import Mix
from ._openai import Whole, error
from ._scenarios import Rule
from ._spec import FAULTS, GENERIC_PARAMS, FaultSpecError, ParamInfo
from ._verdict import judge

if TYPE_CHECKING:
    from ._state import ServerState

__all__ = ["METRICS", "PREFIX", "catalogue", "control"]

PREFIX = "/_fault/"
_FILTERS = ("key", "request_id", "idempotency_key")
# Requests in a journal page, by default and at most: freezing and encoding a request costs
# the server's loop ~15 us, so a default page holds it ~8 ms and the largest ~75 ms.
PAGE = 500
MAX_PAGE = 5000


class _Bad(Exception):
    """A control request that cannot be applied; its message goes into the 400."""


def control(
    method: str,
    path: str,
    query: str,
    body: bytes,
    state: ServerState,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> Whole:
    """Answer one control request, unless `ControlGuard` refuses it (``headers`` are its)."""
    refusal = state.guard.refusal(method, body, headers)
    if refusal is not None:
        return refusal
    methods = _ROUTES.get(path)
    if methods is None:
        known = ", ".join(_ROUTES)
        return error(404, f"unknown control path {path!r}; known: {known}")
    handler = methods.get(method)
    if handler is None:
        return error(405, f"{path} takes {' or '.join(methods)}, not {method}")
    try:
        params = _query(query)
        data = _body(body)
        result = handler(state, params, data)
        return result if isinstance(result, Whole) else _json(result)
    except (_Bad, FaultSpecError, TypeError) as exc:
        return error(400, f"{method} {path}: {exc}", code="invalid_control")


Handler = Callable[["ServerState", dict[str, str], Any], object]


def _stats(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    stats: dict[str, object] = dataclasses.asdict(state.counters.snapshot())
    # Written straight from the counts' tuples: a dict per key (100,000 of them) is what
    # made the garbage collector stop the whole process for a full pass.
    keys = []
    for i, (k, (r, c, f)) in enumerate(state.counters.counts()):
        keys.append(f'{_dumps(k)}:{{"requests":{r},"connections":{c},"faulted":{f}}}')
        let_the_loop_run(i)
    stats["keys"] = _Raw("{" + ",".join(keys) + "}")
    return stats


def _reset(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    everything = False
    if data is not None:
        if not isinstance(data, dict) or set(data) - {"all"}:
            raise _Bad(f'the body must be empty or {{"all": true}}, got {data!r}')
        everything = data.get("all", False)
        if not isinstance(everything, bool):
            raise _Bad(f"'all' must be true or false, got {everything!r}")
    if everything:
        state.scenarios.clear()
        state.mix.set(None)
    state.reset()
    return _stats(state, {}, None)


def _list(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    return catalogue()


def _get_scenarios(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ("key",))
    return {"scenarios": [r.as_dict() for r in state.scenarios.rules(params.get("key"))]}


def _put_scenarios(state: ServerState, params: dict[str, str], data: Any) -> object:
    """Replace every rule, or with ``"key"`` every rule of that key."""
    _only(params, ())
    if not isinstance(data, dict) or set(data) - {"scenarios", "key"} or "scenarios" not in data:
        raise _Bad('the body must be {"scenarios": [...]} with an optional "key"')
    key = data.get("key")
    if key is not None and (not isinstance(key, str) or not key):
        raise _Bad(f"'key' must be a non-empty string, got {key!r}")
    prefix = f"put-{key}-" if key else "put-"
    rules = _rules(state, data["scenarios"], key, prefix)
    state.scenarios.replace(rules, key)
    return _get_scenarios(state, {"key": key} if key else {}, None)


def _post_scenarios(state: ServerState, params: dict[str, str], data: Any) -> object:
    """Add rules at the end of the queue (a rule whose id is armed replaces it)."""
    _only(params, ())
    items = data.get("scenarios") if isinstance(data, dict) and "scenarios" in data else [data]
    if isinstance(data, dict) and "scenarios" in data and set(data) != {"scenarios"}:
        raise _Bad('the body must be one scenario or {"scenarios": [...]}')
    rules = _rules(state, items, None, None)
    for rule in rules:
        state.scenarios.add(rule)
    return {"scenarios": [r.as_dict() for r in state.scenarios.rules()]}


def _delete_scenarios(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ("key",))
    return {"cleared": state.scenarios.clear(params.get("key"))}


def _get_mix(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    mix = state.mix.mix
    return {"mix": None if mix is None else mix.as_dict()}


def _put_mix(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    state.mix.set(Mix.from_json(data))
    return _get_mix(state, {}, None)


def _delete_mix(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    state.mix.set(None)
    return {"mix": None}


def _journal(state: ServerState, params: dict[str, str], data: Any) -> object:
    """One page: ``limit`` requests (`PAGE` by default) past the cursor ``after``."""
    _only(params, (*_FILTERS, "after", "limit"))
    after = _cursor(params.pop("after", None))
    limit = _limit(params.pop("limit", None))
    records, cursor = state.journal.page(params, after, limit)
    return {
        "connections": [r.as_dict() for r in records],
        "next": None if cursor is None else f"{cursor[0]}.{cursor[1]}",
    }


def _forget(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    if not isinstance(data, dict) or set(data) != {"key"}:
        raise _Bad('the body must be {"key": K}')
    key = data["key"]
    if not isinstance(key, str) or not key:
        raise _Bad(f"'key' must be a non-empty string, got {key!r}")
    return {"forgot": state.forget(key)}


def _cursor(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    conn, dot, index = text.partition(".")
    if not (dot and conn.isdigit() and index.isdigit()):
        raise _Bad(f"'after' must be the 'next' of a previous page, like '12.3', got {text!r}")
    return int(conn), int(index)


def _limit(text: str | None) -> int:
    if text is None:
        return PAGE
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise _Bad(f"'limit' must be an integer from 1 to {MAX_PAGE}, got {text!r}")
    return int(text)


def _verdict(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, _FILTERS)
    if not params:
        raise _Bad("say whose verdict: ?key=..., ?request_id=... or ?idempotency_key=...")
    return judge(state.journal.snapshot(**params)).as_dict()


def _get_fixtures(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    return {"fixtures": [f.as_dict() for f in state.fixtures.fixtures()]}


def _put_fixtures(state: ServerState, params: dict[str, str], data: Any) -> object:
    """Replace every fixture: ``{"fixtures": [...]}`` (those without an id: ``put-<n>``)."""
    _only(params, ())
    state.fixtures.replace(_fixtures_of(data, "put"))
    return _get_fixtures(state, {}, None)


def _post_fixtures(state: ServerState, params: dict[str, str], data: Any) -> object:
    """Add fixtures: one, or ``{"fixtures": [...]}``; a known id replaces its fixture."""
    _only(params, ())
    items = data if isinstance(data, dict) and "fixtures" in data else [data]
    state.fixtures.add(_fixtures_of(items, state.scenarios.new_id()))
    return _get_fixtures(state, {}, None)


def _delete_fixtures(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    return {"cleared": state.fixtures.clear()}


def _fixtures_of(data: object, prefix: str) -> list[Fixture]:
    if data is None:
        raise _Bad('the body must be {"fixtures": [...]}')
    return fixtures_of(data, prefix)


def _metrics(state: ServerState, params: dict[str, str], data: Any) -> object:
    _only(params, ())
    return exposition(state)


_ROUTES: dict[str, dict[str, Handler]] = {
    METRICS: {"GET": _metrics},
    "/_fault/stats": {"GET": _stats},
    "/_fault/reset": {"POST": _reset},
    "/_fault/list": {"GET": _list},
    "/_fault/scenarios": {
        "GET": _get_scenarios,
        "PUT": _put_scenarios,
        "POST": _post_scenarios,
        "DELETE": _delete_scenarios,
    },
    "/_fault/mix": {"GET": _get_mix, "PUT": _put_mix, "DELETE": _delete_mix},
    "/_fault/journal": {"GET": _journal},
    "/_fault/verdict": {"GET": _verdict},
    "/_fault/forget": {"POST": _forget},
    "/_fault/fixtures": {
        "GET": _get_fixtures,
        "PUT": _put_fixtures,
        "POST": _post_fixtures,
        "DELETE": _delete_fixtures,
    },
}


def _rules(state: ServerState, items: object, key: str | None, prefix: str | None) -> list[Rule]:
    """Validated rules; without an ``id``, a rule is named ``<prefix><position>`` (so that
    the same PUT twice arms the same rules), or gets a fresh id (``prefix`` None)."""
    if not isinstance(items, list):
        raise _Bad(f"'scenarios' must be a list, got {items!r}")
    rules = []
    for i, item in enumerate(items):
        default_id = state.scenarios.new_id() if prefix is None else f"{prefix}{i + 1}"
        try:
            rule = Rule.from_json(item, default_id)
        except FaultSpecError as exc:
            raise _Bad(f"scenario {i}: {exc}") from None
        if key is not None:
            if rule.match.key not in (None, key):
                raise _Bad(f"scenario {i} matches key {rule.match.key!r}, not {key!r}")
            rule = dataclasses.replace(rule, match=dataclasses.replace(rule.match, key=key))
        rules.append(rule)
    return rules


def _query(query: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if len(values) != 1 or not values[0]:
            raise _Bad(f"query parameter {name!r} must be given once, with a value")
        params[name] = values[0]
    return params


def _only(params: dict[str, str], allowed: tuple[str, ...]) -> None:
    unknown = set(params) - set(allowed)
    if unknown:
        known = ", ".join(allowed) or "none"
        raise _Bad(f"unknown query parameter(s) {sorted(unknown)}; known: {known}")


def _body(body: bytes) -> Any:
    if not body.strip():
        return None
    try:
        return loads_limited(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Bad(f"the body is not valid JSON: {exc}") from None


def catalogue() -> dict[str, Any]:
    """The fault catalogue as JSON-ready data."""
    return {
        "faults": [
            {
                "name": info.name,
                "group": info.group,
                "scope": info.scope,
                "description": info.description,
                "params": [_param(p) for p in info.params],
            }
            for info in FAULTS.values()
        ],
        "generic_params": [_param(p) for p in GENERIC_PARAMS.values()],
    }


def _param(info: ParamInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"name": info.name, "type": info.kind, "default": info.default}
    if info.choices:
        out["choices"] = list(info.choices)
    out["help"] = info.help
    return out


def _json(payload: object) -> Whole:
    parts: list[str] = []
    _encode(payload, parts, 2)
    return Whole(200, "".join(parts).encode())


class _Raw(str):
    """Text that is JSON already."""


def _encode(value: object, out: list[str], depth: int) -> None:
    """``value`` as compact JSON, into ``out``: the outer ``depth`` levels of containers
    piece by piece, so that no single C call holds the GIL over a big answer (a 50,000
    request verdict in one `json.dumps` held it 0.2 s). Compact: an indent would make json
    use its pure-Python encoder, ~10x slower."""
    if isinstance(value, _Raw):
        out.append(value)
    elif depth > 0 and isinstance(value, dict) and value:
        out.append("{")
        for i, (name, item) in enumerate(value.items()):
            out.append(("," if i else "") + _dumps(str(name)) + ":")
            _encode(item, out, depth - 1)
            let_the_loop_run(i)
        out.append("}")
    elif depth > 0 and isinstance(value, (list, tuple)) and value:
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out, depth - 1)
            let_the_loop_run(i)
        out.append("]")
    else:
        out.append(_dumps(value))


def let_the_loop_run(i: int) -> None:
    """Every `_EVERY` items of a long piece of work off the loop, let the server's loop
    take the GIL at once (``time.sleep(0)`` releases it), instead of after the
    interpreter's 5 ms switch interval at each of its wake-ups."""
    if i % _EVERY == _EVERY - 1:
        time.sleep(0)


_EVERY = 256


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))
