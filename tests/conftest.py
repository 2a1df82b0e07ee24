"""Fixtures for every test group (tests/client, tests/fault_server, tests/integrations,
tests/frameworks); the helpers themselves are in tests/support.

The `fault_server` fixture (one server per session, in its own thread) and `fault_key`
come from our pytest plugin, `fault_server.pytest_plugin`, registered as an entry point.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import stallproof

from .support.clients import KEY, MakeClient, assert_pool_clean
from .support.memory import freeze_heap
from .support.rawserver import RawServer

# `pytester`: tests of our pytest plugin run a session of their own.
pytest_plugins = ["pytester"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the heap the collection built (see `freeze_heap`): every full pass of the
    cyclic collector in every test would otherwise walk it again."""
    freeze_heap()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_client() -> AsyncIterator[MakeClient]:
    """Factory of clients that are closed, and checked for leaks, at the end of the test.

    Clients make one attempt per call unless the test passes ``retry=``, so a bound test
    sees exactly the bound it set up; retries have their own tests.
    """
    clients: list[stallproof.Client] = []

    def factory(base_url: str, **kwargs: Any) -> stallproof.Client:
        kwargs.setdefault("api_key", KEY)
        kwargs.setdefault("retry", None)
        client = stallproof.Client(base_url=base_url, **kwargs)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        assert_pool_clean(client)
        await client.aclose()
        if client._engine.pool is not None and hasattr(client._engine.pool, "_client"):
            await client._engine.pool._client.aclose()  # the http_client the test made


@pytest.fixture
def raw_server() -> Iterator[Any]:
    """Factory of `RawServer`s (see tests/support/rawserver.py), stopped at the end of the test."""
    servers: list[RawServer] = []

    def factory(answer: Any, **kwargs: Any) -> RawServer:
        server = RawServer(answer, **kwargs)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.close()
