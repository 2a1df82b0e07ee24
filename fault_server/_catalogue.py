"""The fault catalogue: every way the server can misbehave, with its parameters.

Each entry names a fault, says what it does on the wire and lists its parameters with their
types, defaults and bounds. `FAULTS` keeps the order of docs/fault_server.md: ``healthy``,
then the faults by the layer they break (socket, HTTP framing, SSE/OpenAI, status, time).
What each fault does is in `_behaviours` (and its siblings), keyed by the same names.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ._params import FaultInfo, ParamInfo, choice, flag, integer, number, text

__all__ = ["CONNECTION_FAULTS", "FAULTS"]

_MIB = 1024 * 1024
_INTERVAL_HELP = "Seconds between sends."
_AFTER_HELP = "Content chunks sent first (after the role chunk) when streaming."


def _after(default: int) -> ParamInfo:
    return integer("after", default, _AFTER_HELP)


def _interval(default: float) -> ParamInfo:
    return number("interval", default, _INTERVAL_HELP)


_HEALTHY = (
    FaultInfo("healthy", "A normal response; with delay/token_interval, healthy but slow."),
)

_SOCKET = (
    FaultInfo(
        "half_open",
        "Accept, never answer: the request is not parsed past its head, nothing is ever "
        "sent; the server closes after `hold`. A large request body is not read either, so "
        "the client's send stalls once the socket buffers are full.",
        group="socket",
    ),
    FaultInfo(
        "slow_accept",
        "Connection level, armed by a scenario: the kernel completes the handshake (connect "
        "succeeds) but the server does not read the connection for `pause` seconds, then "
        "serves it normally.",
        (number("pause", 1.0, "Seconds before the server starts reading the connection."),),
        group="socket",
        scope="connection",
    ),
    FaultInfo(
        "refuse",
        "Connection level, armed by a scenario: the server aborts the accepted connection "
        "with a TCP RST before reading a byte, the nearest a listening port comes to "
        "refusing. A true ECONNREFUSED (nothing listens) is at `refused_url`.",
        group="socket",
        scope="connection",
    ),
    FaultInfo(
        "tls_stall",
        "Connection level, armed by a scenario, on the TLS listener (`tls=True`, "
        "`tls_url`): TCP is accepted, the ClientHello read, and the handshake never "
        "answered; the server closes after `hold` (at most max_hold).",
        group="socket",
        scope="connection",
    ),
    FaultInfo(
        "slicer",
        "The healthy response, head included, written in slices of `size` bytes, each "
        "varied by up to ±`variation` bytes, `interval` seconds apart (Toxiproxy's slicer). "
        "A stream is sliced frame by frame as it comes.",
        (
            integer("size", 8, "Average bytes per slice.", 1),
            integer("variation", 4, "Most bytes a slice differs from `size`.", 0),
            number("interval", 0.005, "Seconds between slices."),
            integer("seed", 0, "Seed of the variation: the same seed gives the same slices."),
        ),
        group="socket",
    ),
    FaultInfo(
        "reset",
        "Abort with a TCP RST. when=before: read the request, send nothing, RST. when=mid: "
        "headers and part of the body (stream: role + `after` content chunks; non-stream: "
        "half the body), then RST.",
        (choice("when", "before", "When to reset.", "before", "mid"), _after(1)),
        group="socket",
    ),
    FaultInfo(
        "close_mid_body",
        "Headers (Content-Length of the full body; stream: chunked SSE), part of the body "
        "(stream: role + `after` content chunks, no [DONE], no chunk terminator; non-stream: "
        "half), then a clean FIN.",
        (_after(2),),
        group="socket",
    ),
    FaultInfo(
        "half_close",
        "Headers and part of the body (as close_mid_body), then shutdown(SHUT_WR): a FIN, "
        "but the server keeps the socket open and reading until the client closes or `hold`.",
        (_after(2),),
        group="socket",
    ),
    FaultInfo(
        "cut_after",
        "The healthy response, head included, cut after `bytes` bytes; then `then`: close "
        "(FIN), reset (RST) or stall (silence until `hold`).",
        (
            integer("bytes", 100, "Bytes of the response sent before the cut.", 0),
            choice("then", "close", "What follows the cut.", "close", "reset", "stall"),
        ),
        group="socket",
    ),
)

_HTTP = (
    FaultInfo(
        "stall_headers",
        "Read the whole request, never send a status line; close after `hold`.",
    ),
    FaultInfo(
        "stall_in_headers",
        "Send the status line and every header line but not the blank line that ends the "
        "head; then silence until `hold`.",
    ),
    FaultInfo(
        "trickle_headers",
        "Send the response head `chunk` bytes every `interval` seconds, then the healthy "
        "body at once.",
        (_interval(0.5), integer("chunk", 1, "Bytes per send.", 1)),
    ),
    FaultInfo(
        "trickle_body",
        "200 with a correct Content-Length at once, then the normal body (JSON, or the SSE "
        "stream) `chunk` bytes every `interval` seconds, until done or `hold`.",
        (_interval(1.0), integer("chunk", 1, "Bytes per send.", 1)),
    ),
    FaultInfo(
        "content_length_lie",
        "Content-Length `extra` bytes larger than the body; send the whole body (stream: up "
        "to and with [DONE]), then keep the socket open, sending nothing, until `hold`.",
        (integer("extra", 100, "Bytes promised but never sent.", 1),),
    ),
    FaultInfo(
        "chunked_no_end",
        "A chunked body that never gets its final 0-size chunk: non-stream the whole JSON, "
        "stream every event but [DONE]; then silence with the socket open until `hold`.",
    ),
    FaultInfo(
        "endless_body",
        "A body that never ends: stream, valid content chunks forever, one every `interval`; "
        "non-stream, a chunked JSON completion whose content string grows a word every "
        "`interval`. Ends at `hold`.",
        (_interval(0.01),),
    ),
    FaultInfo(
        "huge_body",
        "200 with a body of `size` bytes, generated as it is sent: non-stream one valid JSON "
        "completion with Content-Length; stream a single `data:` line of `size` bytes, then "
        "[DONE]. Ends at `hold` if the client reads too slowly.",
        (integer("size", 64 * _MIB, "Bytes of body (non-stream) or of the data line.", 1024),),
    ),
)

_SSE = (
    FaultInfo(
        "sse_keepalive",
        "Stream: 200 text/event-stream, then ': keep-alive' comments every `interval` with "
        "no data, until `hold`. Non-stream: 200 chunked application/json, then a newline "
        "every `interval`, until `hold`.",
        (_interval(0.5),),
        group="sse",
    ),
    FaultInfo(
        "sse_pings",
        "Always an SSE stream: the role chunk, then an `event: <event>` with data "
        '{"type": "<event>"} every `interval`, never content, until `hold`.',
        (_interval(0.5), ParamInfo("event", "str", "ping", "The event name.")),
        group="sse",
    ),
    FaultInfo(
        "sse_empty_deltas",
        "Always an SSE stream (whatever `stream` says): a role chunk, then valid chunks whose "
        "delta is {} or has content '' every `interval`, never any content, until `hold`.",
        (_interval(0.5),),
        group="sse",
    ),
    FaultInfo(
        "sse_stall",
        "Stream: the role chunk and `after` content chunks, then silence with the socket "
        "open until `hold`. Non-stream: headers with Content-Length and half the body, then "
        "silence until `hold`.",
        (_after(2),),
        group="sse",
    ),
    FaultInfo(
        "no_done",
        "Stream: every chunk, the chunked terminator and a clean close, but no "
        "'data: [DONE]'. Non-stream: a normal response.",
        group="sse",
    ),
    FaultInfo(
        "done_then_hold",
        "Stream: every event up to and with [DONE], then the body is never terminated and "
        "the socket stays open until `hold`. Non-stream: the JSON, chunked, never "
        "terminated.",
        group="sse",
    ),
    FaultInfo(
        "data_after_done",
        "Stream: the whole stream with [DONE], then more content chunks ('after-done') and "
        "another [DONE], well framed. Non-stream: a normal response.",
        group="sse",
    ),
    FaultInfo(
        "malformed_json",
        '200, but non-stream the body is the truncated JSON \'{"id": "x", "choices": [\' '
        "and stream one valid chunk is followed by 'data: {not json', then [DONE].",
        group="sse",
    ),
    FaultInfo(
        "error_event",
        "Stream: 200, the role chunk and `after` content chunks, then an OpenAI error object "
        "as a data event (as an 'event: error' with event=true), then the end of the body, "
        "no [DONE]. Non-stream: 200 with an error object as the body.",
        (_after(1), flag("event", False, "Send it as an 'event: error' event.")),
        group="sse",
    ),
    FaultInfo(
        "sse_crlf",
        "Stream: the healthy stream with every line ended by CRLF (eol=crlf) or a lone CR "
        "(eol=cr), both valid SSE. Non-stream: a normal response.",
        (choice("eol", "crlf", "The line ending.", "crlf", "cr"),),
        group="sse",
    ),
    FaultInfo(
        "sse_multiline",
        "Stream: the healthy stream with each JSON spread over several `data:` lines (to be "
        "joined with newlines), plus `id:`, `retry:` and comment lines. Non-stream: normal.",
        group="sse",
    ),
    FaultInfo(
        "sse_long_line",
        "Stream: the role chunk, then one valid content chunk whose line is `size` bytes, "
        "then the rest of the stream. Non-stream: a normal response.",
        (integer("size", _MIB, "Bytes of the long data line.", 1024, 16 * _MIB),),
        group="sse",
    ),
    FaultInfo(
        "endless_line",
        "Always an SSE stream: the role chunk, then one `data:` line whose JSON string grows "
        "a word every `interval` and never ends: bytes arrive, no event completes.",
        (_interval(0.05),),
        group="sse",
    ),
    FaultInfo(
        "bad_usage",
        "The usage report broken. mode=missing: no usage chunk although include_usage asked "
        "for one (non-stream: no usage key); null: usage is null; early: the usage chunk "
        "comes before the content (non-stream: normal).",
        (choice("mode", "missing", "How usage is broken.", "missing", "null", "early"),),
        group="sse",
    ),
    FaultInfo(
        "tool_split",
        "A tool call whose arguments hold non-ASCII text and escapes: stream, the argument "
        "deltas split inside JSON escapes (after a backslash, inside \\uXXXX) and each frame "
        "sent in two chunks split inside a UTF-8 character; non-stream, the body sent in two "
        "writes split inside a UTF-8 character. The arguments join to valid JSON.",
        group="sse",
    ),
    FaultInfo(
        "index_gap",
        "Stream: two tool calls with indices 0 and 2 (none at 1), each in pieces, then "
        "finish_reason tool_calls. Non-stream: the same two tool calls.",
        group="sse",
    ),
    FaultInfo(
        "tool_args_unclosed",
        'A tool call whose arguments JSON never closes (\'{"text": "...\'), with '
        "finish_reason tool_calls and, stream, [DONE]: well framed, unparsable arguments.",
        group="sse",
    ),
    FaultInfo(
        "json_for_stream",
        "Stream: 200 application/json with a whole chat.completion (Content-Length) instead "
        "of an event stream. Non-stream: a normal response.",
        group="sse",
    ),
)

_STATUS = (
    FaultInfo(
        "status",
        "An HTTP error with an OpenAI-shaped error body and optional retry headers. The "
        "response is well formed and the connection stays usable. With `interval`, the body "
        "comes one byte every `interval` seconds.",
        (
            integer("code", 500, "The status code.", 200, 599),
            text("retry_after", "Retry-After header, verbatim."),
            number(
                "retry_after_date",
                None,
                "Retry-After as an HTTP date this many seconds from now.",
                minimum=-1e9,
            ),
            number("retry_after_ms", None, "retry-after-ms header."),
            flag("should_retry", None, "x-should-retry header: true or false."),
            text("body", "Body to send instead of the error JSON."),
            number("interval", 0.0, "Seconds between body bytes (a slow error body)."),
        ),
        group="status",
    ),
)

_RATE = (
    FaultInfo(
        "rate_limit",
        "A token bucket per key (and per limit/rate): each request takes a token and gets "
        "the healthy answer with rate-limit headers (x-ratelimit-limit/remaining/reset-"
        "requests; anthropic-ratelimit-requests-* on /v1/messages); an empty bucket answers "
        "429 with Retry-After (whole seconds, rounded up), retry-after-ms and remaining 0.",
        (
            integer("limit", 3, "Bucket capacity: requests allowed in a burst.", 1),
            number("rate", 1.0, "Tokens added back per second.", 0.001),
        ),
        group="status",
    ),
)

_TIME = (
    FaultInfo(
        "slow_first_token",
        "Stream: the head and the role chunk at once, then `wait` seconds before the first "
        "content chunk. Non-stream: the head (Content-Length) at once, the body after `wait`.",
        (number("wait", 1.0, "Seconds between the head and the first content."),),
        group="time",
    ),
    FaultInfo(
        "token_rate",
        "Stream: a content chunk every 1/`tps` seconds, each interval varied by up to "
        "±`jitter` of itself from a generator seeded with `seed`. Non-stream: the whole "
        "answer after the sum of those intervals.",
        (
            number("tps", 10.0, "Content tokens per second.", 0.01),
            number("jitter", 0.0, "Fraction of the interval to vary it by, 0 to 1.", 0, 1),
            integer("seed", 0, "Seed of the jitter: the same seed gives the same pauses."),
        ),
        group="time",
    ),
)

_CATALOGUE = (*_HEALTHY, *_SOCKET, *_HTTP, *_SSE, *_STATUS, *_RATE, *_TIME)

FAULTS: Mapping[str, FaultInfo] = MappingProxyType({info.name: info for info in _CATALOGUE})
CONNECTION_FAULTS = frozenset(name for name, info in FAULTS.items() if info.scope == "connection")
