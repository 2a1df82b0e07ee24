"""The ``/_fault/`` control endpoints: stats, reset, and the catalogue."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ._faults import FAULTS, GENERIC_PARAMS, ParamInfo
from ._openai import Whole, error
from ._stats import Counters

__all__ = ["PREFIX", "catalogue", "control"]

PREFIX = "/_fault/"


def control(method: str, path: str, counters: Counters) -> Whole:
    """Answer ``GET /_fault/stats``, ``POST /_fault/reset`` or ``GET /_fault/list``."""
    routes = {"/_fault/stats": "GET", "/_fault/reset": "POST", "/_fault/list": "GET"}
    wanted = routes.get(path)
    if wanted is None:
        return error(404, f"unknown control path {path!r}; known: {', '.join(routes)}")
    if method != wanted:
        return error(405, f"{path} takes {wanted}, not {method}")
    if path == "/_fault/reset":
        counters.reset()
    if path == "/_fault/list":
        return _json(catalogue())
    stats = dataclasses.asdict(counters.snapshot())
    stats["keys"] = {k: dataclasses.asdict(v) for k, v in counters.keys().items()}
    return _json(stats)


def catalogue() -> dict[str, Any]:
    """The fault catalogue as JSON-ready data."""
    return {
        "faults": [
            {
                "name": info.name,
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
    return Whole(200, json.dumps(payload, indent=1).encode())
