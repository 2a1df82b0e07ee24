"""Content-Encoding decoding that counts what it decodes, as it decodes it.

A compressed body is small on the wire and large in memory: 809 bytes of brotli, or a
kilobyte of gzip inside gzip, decode to a gibibyte. A cap on the bytes received cannot see
that, and a decoder that turns each received chunk into all the data it holds (httpx's
does) blocks the event loop for seconds and takes the gibibyte before anyone counts it.

`ContentDecoder` decodes every layer of ``Content-Encoding`` (``gzip``, ``deflate``, and
``br`` and ``zstd`` when the ``compression`` extra is installed) in pieces of at most
`PIECE` bytes, and counts each layer's output against the cap as it goes: it stops the
moment a layer's output passes the cap, having decoded at most one piece more. The engine
awaits a checkpoint between pieces, so a call's deadline fires in the middle of decoding.

Errors are internal (`TooLarge`, `BadEncoding`); the engine turns them into the call's
`ResponseTooLarge`, `MalformedResponse` or `TruncatedResponse`.
"""

from __future__ import annotations

import importlib
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from . import _exceptions as exc

if TYPE_CHECKING:
    from ._call import Call

__all__ = [
    "PIECE",
    "SUPPORTED",
    "BadEncoding",
    "ContentDecoder",
    "Truncated",
    "TooLarge",
    "accept_encoding",
    "content_encodings",
    "decoded_headers",
    "typed_errors",
]

# The most one step of decoding produces before the caller counts it and may yield.
PIECE = 64 * 1024


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - depends on the optional extra
        return None


_brotli = _optional("brotli")
if _brotli is not None and not hasattr(_brotli.Decompressor(), "can_accept_more_data"):
    _brotli = None  # brotli < 1.2 cannot bound its output per call: not offered
_zstd = _optional("zstandard")


class TooLarge(Exception):
    """A layer's decoded output passed the cap.

    ``head`` is the start of the final output's last piece that still fit under the cap
    (what a reader that cuts a body at the cap, rather than failing, keeps of it).
    """

    def __init__(self, produced: int, head: bytes = b"") -> None:
        super().__init__(produced)
        self.head = head


class BadEncoding(Exception):
    """The body is not valid for its Content-Encoding (or names one we cannot decode)."""


class Truncated(Exception):
    """The body ended in the middle of a compressed stream."""


class _Layer(Protocol):
    def decode(self, data: bytes) -> Iterator[bytes]: ...

    def finished(self) -> bool: ...


class _Zlib:
    """gzip or deflate, with zlib's ``max_length`` bounding every step's output."""

    def __init__(self, wbits: int, *, fallback_wbits: int | None = None) -> None:
        self._d = zlib.decompressobj(wbits)
        self._fallback = fallback_wbits
        self._started = False

    def decode(self, data: bytes) -> Iterator[bytes]:
        pending = data
        while pending and not self._d.eof:
            try:
                out = self._d.decompress(pending, PIECE)
            except zlib.error as e:
                if self._fallback is None or self._started:
                    raise BadEncoding(str(e)) from None
                # "deflate" is raw deflate or zlib-wrapped in the wild: try the other one.
                self._d = zlib.decompressobj(self._fallback)
                self._fallback = None
                continue
            self._started = True
            pending = self._d.unconsumed_tail
            if out:
                yield out
        # Bytes after the end of the stream are ignored, as httpx and browsers do.

    def finished(self) -> bool:
        return self._d.eof


class _Brotli:
    """br, with brotli's ``output_buffer_limit`` (brotli >= 1.2) bounding every step."""

    def __init__(self) -> None:
        assert _brotli is not None
        self._d: Any = _brotli.Decompressor()

    def decode(self, data: bytes) -> Iterator[bytes]:
        d = self._d
        pending = data
        while True:
            if d.is_finished():
                return
            try:
                if d.can_accept_more_data():
                    if not pending:
                        return
                    out = d.process(pending, output_buffer_limit=PIECE)
                    pending = b""
                else:
                    out = d.process(b"", output_buffer_limit=PIECE)
            except _brotli.error as e:
                raise BadEncoding(str(e)) from None
            if out:
                yield out

    def finished(self) -> bool:
        return bool(self._d.is_finished())


class _Zstd:
    """zstd through ``zstandard``'s stream writer: its sink raises once the cap is passed.

    ``zstandard`` cannot bound one call's output, but it hands its output to the sink in
    pieces of `PIECE` bytes, and an exception from the sink stops it there.
    """

    def __init__(self, cap: int) -> None:
        assert _zstd is not None
        self._cap = cap
        self._produced = 0
        self._out: deque[bytes] = deque()
        self._w: Any = _zstd.ZstdDecompressor().stream_writer(
            self, write_size=PIECE, write_return_read=True
        )
        self._frames = 0

    def write(self, data: bytes) -> int:  # the stream writer's sink
        self._produced += len(data)
        if self._produced > self._cap:
            raise TooLarge(self._produced)
        self._out.append(bytes(data))
        return len(data)

    def decode(self, data: bytes) -> Iterator[bytes]:
        over = False
        try:
            self._w.write(data)
        except TooLarge:
            over = True  # hand over what was decoded first: the caller counts it too
        except _zstd.ZstdError as e:
            raise BadEncoding(str(e)) from None
        while self._out:
            yield self._out.popleft()
        if over:
            raise TooLarge(self._produced)

    def finished(self) -> bool:
        # zstandard's writer does not report the end of a frame; a truncated frame shows
        # as a body that decoded to less than it said, which JSON or SSE parsing catches.
        return True


SUPPORTED: tuple[str, ...] = (
    "gzip",
    "deflate",
    *(("br",) if _brotli is not None else ()),
    *(("zstd",) if _zstd is not None else ()),
)


def _layer(name: str, cap: int) -> _Layer:
    if name in ("gzip", "x-gzip"):
        return _Zlib(zlib.MAX_WBITS | 16)
    if name == "deflate":
        return _Zlib(zlib.MAX_WBITS, fallback_wbits=-zlib.MAX_WBITS)
    if name == "br" and _brotli is not None:
        return _Brotli()
    if name == "zstd" and _zstd is not None:
        # One piece of slack, so the count after the last layer (which keeps the head of
        # the piece that crossed the cap) fires first.
        return _Zstd(cap + PIECE)
    hint = " (install stallproof[compression])" if name in ("br", "zstd") else ""
    raise BadEncoding(f"unsupported Content-Encoding {name[:40]!r}{hint}")


def content_encodings(headers: Sequence[tuple[bytes, bytes]]) -> list[str]:
    """The codings applied to a body, in the order they were applied (identity left out)."""
    names: list[str] = []
    for k, v in headers:
        if k.lower() == b"content-encoding":
            for token in v.decode("latin-1").split(","):
                name = token.strip().lower()
                if name and name != "identity":
                    names.append(name)
    return names


def accept_encoding(value: bytes) -> bytes:
    """An ``Accept-Encoding`` value cut down to the codings we can decode with a cap."""
    kept = [
        token.strip()
        for token in value.decode("latin-1").split(",")
        if token.split(";", 1)[0].strip().lower() in (*SUPPORTED, "identity", "x-gzip")
    ]
    return ", ".join(kept).encode("latin-1") if kept else b"identity"


class ContentDecoder:
    """Decode a body's ``Content-Encoding`` layers, each output counted against ``cap``.

    Args:
        encodings: the codings in the order they were applied (see `content_encodings`).
        cap: the most bytes any layer may produce; passing it raises `TooLarge`.

    Raises:
        BadEncoding: an unknown coding (at construction) or invalid data (while feeding).
    """

    def __init__(self, encodings: Sequence[str], cap: int) -> None:
        if len(encodings) > 4:
            raise BadEncoding(f"{len(encodings)} Content-Encoding layers (at most 4 are decoded)")
        self._cap = cap
        # Decoding undoes the last coding applied first.
        self._layers = [_layer(name, cap) for name in reversed(encodings)]
        self._counts = [0] * (len(self._layers) + 1)

    @property
    def identity(self) -> bool:
        return not self._layers

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of ``data``, each at most `PIECE` bytes (identity: ``data``)."""
        return self._through(0, data)

    def _through(self, i: int, data: bytes) -> Iterator[bytes]:
        count = self._counts[i] = self._counts[i] + len(data)
        last = i == len(self._layers)
        if count > self._cap and (i or last):
            over = count - self._cap
            raise TooLarge(count, data[: len(data) - over] if last else b"")
        if last:
            yield data
            return
        for piece in self._layers[i].decode(data):
            yield from self._through(i + 1, piece)

    def finish(self) -> None:
        """The body ended: every layer must have reached the end of its stream."""
        if self._counts[0] and not all(layer.finished() for layer in self._layers):
            raise Truncated("the body ended in the middle of its compressed data")


def decoded_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Response headers as they are once the body is decoded: no Content-Encoding and no
    Content-Length (the decoded length differs), so nothing downstream decodes it again."""
    return [(k, v) for k, v in headers if k.lower() not in (b"content-encoding", b"content-length")]


class typed_errors:
    """Turn the decoder's errors into the call's typed ones.

    A class, not a generator context manager: a stream enters one per read.
    """

    __slots__ = ("_call", "_cap")

    def __init__(self, call: Call, cap: int) -> None:
        self._call = call
        self._cap = cap

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        call, cap = self._call, self._cap
        if isinstance(e, TooLarge):
            raise call.error(
                exc.ResponseTooLarge,
                f"the decoded body passed max_response_bytes={cap}",
                limit=cap,
            ) from None
        if isinstance(e, Truncated):
            raise call.error(exc.TruncatedResponse, str(e)) from None
        if isinstance(e, BadEncoding):
            raise call.error(exc.MalformedResponse, f"could not decode the body: {e}") from None
