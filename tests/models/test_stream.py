"""Streamed replies (``chat(..., stream=True)``) from a real loopback server:
server-sent events assembled into the same ChatReply as a complete reply."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _http_support import MESSAGES, Answer, App, Seen, serving

from agentcompass import ModelSpec
from agentcompass.models import ModelError, chat_client, open_model_clients
from agentcompass.testing import hang_guard

SSE = {"content-type": "text/event-stream", "cache-control": "no-cache"}


def event(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": choices, **extra})


def streaming(*events: bytes):
    async def handler(_: Seen) -> Answer:
        return Answer(body=list(events), headers=SSE)

    return handler


async def call(handler, **kwargs: Any):
    app = App(handler)
    async with hang_guard(20), serving(app) as origin, open_model_clients(1):
        client = chat_client(ModelSpec("m", base_url=origin + "/v1", params={"temperature": 0}))
        try:
            reply = await client.chat(MESSAGES, stream=True, **kwargs)
        except ModelError as exc:
            reply = exc
    return reply, app


async def test_a_streamed_reply_with_text_and_tool_calls_is_assembled():
    tools = [{"type": "function", "function": {"name": "bash"}}]
    reply, app = await call(
        streaming(
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Let me "}),
            chunk({"content": "look."}),
            chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "c1", "type": "function", "function": {"name": "bash", "arguments": ""}}
                    ]
                }
            ),  # fmt: skip
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command"'}}]}),
            # A second call, interleaved by index, as parallel tool calls arrive.
            chunk({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "submit", "arguments": "{}"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "ls -l"}'}}]}),
            chunk({}, finish="tool_calls"),
            b": a comment line, ignored\n\n",
            chunk(None, usage={"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}),
            event(b"[DONE]"),
        ),
        tools=tools,
    )
    assert reply.content == "Let me look."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("c1", "bash", '{"command": "ls -l"}'),
        ("c2", "submit", "{}"),
    ]
    assert json.loads(reply.tool_calls[0].arguments) == {"command": "ls -l"}
    assert reply.usage == {"prompt_tokens": 12, "completion_tokens": 7}
    assert reply.finish_reason == "tool_calls"
    assert reply.message == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -l"}'}},
            {"id": "c2", "type": "function", "function": {"name": "submit", "arguments": "{}"}},
        ],
    }
    body = app.requests[0].json
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["tools"] == tools and body["temperature"] == 0


async def test_a_streamed_tool_call_without_text_has_no_content_as_a_complete_reply():
    reply, _ = await call(
        streaming(
            chunk(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"index": 0, "id": "c1", "function": {"name": "bash", "arguments": '{"command": "true"}'}}
                    ],
                }
            ),  # fmt: skip
            chunk({}, finish="tool_calls"),
            event(b"[DONE]"),
        )
    )
    assert reply.content is None and reply.tool_calls[0].name == "bash"
    assert reply.usage == {"prompt_tokens": 0, "completion_tokens": 0}  # the server sent none


async def test_a_server_that_does_not_stream_is_read_as_a_complete_reply():
    reply, app = await call(lambda _: _plain())
    assert reply.content == "ok" and app.requests[0].json["stream"] is True


async def _plain() -> Answer:
    return Answer()


@pytest.mark.parametrize(
    ("events", "severity", "code"),
    [
        ((event(b"[DONE]"),), "error", "no_valid_output"),
        ((chunk({"role": "assistant"}), event(b"[DONE]")), "error", "no_valid_output"),
        ((event(b"{not json"),), "error", "no_valid_output"),
        ((chunk({"content": "par"}), event({"error": {"message": "engine died"}})), "fatal", "model_server_error"),
    ],
    ids=["no-chunks", "no-message", "not-json", "error-event"],
)
async def test_a_stream_without_a_usable_message_is_classified(events, severity, code):
    exc, _ = await call(streaming(*events))
    assert isinstance(exc, ModelError) and (exc.severity, exc.code) == (severity, code)


async def test_an_error_status_of_a_streamed_request_is_classified_as_any_other():
    async def not_found(_: Seen) -> Answer:
        return Answer(status=404, body=b'{"error": "no such route"}')

    exc, _ = await call(not_found)
    assert (exc.severity, exc.code) == ("fatal", "model_not_found") and "no such route" in exc.message
