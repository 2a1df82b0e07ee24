"""``client.models`` and ``client.embeddings``: the calls agent code makes next to chat,
through the same engine, so no second unbounded client is needed for them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from typing import Any

import pydantic
from openai.types import CreateEmbeddingResponse, Model
from openai.types.embedding_create_params import EmbeddingCreateParams
from typing_extensions import Unpack

from . import _exceptions as exc
from ._completions import CallArgs
from ._engine import Incoming
from ._raw import PerCall, Prepared, RawResponse, Sender, raw_wrapper
from ._request import is_omitted
from ._results import read_result

__all__ = ["Embeddings", "ModelPage", "Models"]


class ModelPage(pydantic.BaseModel):
    """``GET /models``: ``data`` is the list of openai ``Model`` objects."""

    model_config = pydantic.ConfigDict(extra="allow")

    object: str = "list"
    data: list[Model]


class ModelList:
    """What ``client.models.list()`` returns, as openai's paginator: ``await`` it for the
    page, or ``async for`` over the models."""

    def __init__(self, client: Sender, opts: PerCall) -> None:
        self._client = client
        self._opts = opts

    def _prepared(self) -> Prepared[ModelPage]:
        return Prepared(b"GET", "models", None, self._opts, False, _model_page)

    def __await__(self) -> Generator[Any, None, ModelPage]:
        return self._client._run(self._prepared()).__await__()

    async def __aiter__(self) -> AsyncIterator[Model]:
        page = await self._client._run(self._prepared())
        for model in page.data:
            yield model


async def _model_page(incoming: Incoming) -> ModelPage:
    return await read_result(incoming, ModelPage)


class Models:
    """``client.models``."""

    def __init__(self, client: Sender) -> None:
        self._client = client

    def list(self, **params: Unpack[CallArgs]) -> ModelList:
        """The server's models (``await`` it, or ``async for`` over it), bounded."""
        unknown = [name for name in params if name not in _CALL_KEYS]
        if unknown:
            raise TypeError(f"list() got an unexpected keyword argument {unknown[0]!r}")
        opts = PerCall.pop(dict(params))
        return ModelList(self._client, opts)


_CALL_KEYS = frozenset(CallArgs.__annotations__)


class EmbeddingArgs(EmbeddingCreateParams, CallArgs, total=False):
    """openai's ``embeddings.create`` arguments and the per-call ones."""


_EMBEDDING_KEYS = frozenset(EmbeddingArgs.__annotations__)


async def _embeddings(incoming: Incoming) -> CreateEmbeddingResponse:
    return await read_result(incoming, CreateEmbeddingResponse)


class Embeddings:
    """``client.embeddings``."""

    def __init__(self, client: Sender) -> None:
        self._client = client
        self.with_raw_response = RawEmbeddings(self)

    def _prepare(self, params: dict[str, Any]) -> Prepared[CreateEmbeddingResponse]:
        unknown = [name for name in params if name not in _EMBEDDING_KEYS]
        if unknown:
            raise TypeError(f"create() got an unexpected keyword argument {unknown[0]!r}")
        opts = PerCall.pop(params)
        extra_body = params.pop("extra_body", None)
        for name in ("input", "model"):
            if name not in params:
                raise TypeError(f"create() missing required keyword argument: {name!r}")
        if params.get("encoding_format") == "base64":
            # openai decodes base64 itself when it chose it; asked for, it is a str we
            # would refuse as a wrong type.
            raise exc.InvalidRequestError(
                "encoding_format='base64' is not supported: leave it out (floats are returned)"
            )
        body = {k: v for k, v in params.items() if not is_omitted(v)}
        if extra_body:
            body.update(extra_body)
        return Prepared(b"POST", "embeddings", body, opts, False, _embeddings)

    async def create(self, **params: Unpack[EmbeddingArgs]) -> CreateEmbeddingResponse:
        """Embed ``input`` with ``model``; returns openai's ``CreateEmbeddingResponse``."""
        return await self._client._run(self._prepare(dict(params)))


class RawEmbeddings:
    """``client.embeddings.with_raw_response``."""

    def __init__(self, embeddings: Embeddings) -> None:
        self._embeddings = embeddings
        self._run = raw_wrapper(embeddings._client, self._prepare)

    def _prepare(self, **params: Any) -> Prepared[CreateEmbeddingResponse]:
        return self._embeddings._prepare(params)

    async def create(self, **params: Unpack[EmbeddingArgs]) -> RawResponse[CreateEmbeddingResponse]:
        return await self._run(**params)
