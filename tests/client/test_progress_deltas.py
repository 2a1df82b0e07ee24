"""Empty deltas are keep-alives on every API: they never reset first_token or idle."""

from __future__ import annotations

import json

import pytest

from stallproof._progress import Outcome, classify
from stallproof._sse import ServerSentEvent


def event(kind: str, **fields: object) -> ServerSentEvent:
    return ServerSentEvent(json.dumps({"type": kind, **fields}), event=kind)


@pytest.mark.parametrize(
    ("sse", "content"),
    [
        (event("response.output_text.delta", delta=""), False),
        (event("response.output_text.delta", delta="Hi"), True),
        (event("response.function_call_arguments.delta", delta=""), False),
        (event("response.output_item.added", item={"type": "message"}), True),
        (event("content_block_delta", delta={"type": "text_delta", "text": ""}), False),
        (event("content_block_delta", delta={"type": "text_delta", "text": "Hi"}), True),
        (
            event("content_block_delta", delta={"type": "input_json_delta", "partial_json": ""}),
            False,
        ),
        (event("message_delta", delta={"stop_reason": "end_turn"}), True),
        (event("ping"), False),
    ],
)
def test_what_counts_as_content(sse: ServerSentEvent, content: bool) -> None:
    assert classify(sse, Outcome())[0] is content
