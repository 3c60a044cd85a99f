"""The ``google-generate-content`` client against the real scripted loopback
server: a tool call then text, streamed and not, the key in
``x-goog-api-key`` (never the URL), the model named by the route, SPEC 10's
classification (an error chunk inside a stream included), and the wire
module's stream assembly."""

from __future__ import annotations

import json

import pytest
import trio

from agentcompass import ConfigError, ModelSpec, Secret
from agentcompass._models._gemini_wire import GeminiStream, conversation, parse_reply
from agentcompass._models._wire import ReplyError
from agentcompass.models import GeminiClient, ModelError, gemini_client, model_client, open_model_clients
from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import (
    ModelServer,
    echo_headers,
    empty_choices,
    error,
    malformed,
    stream_error,
    text,
    tool_calls,
)

KEY = "AIzaSy-gemini-client-REAL-0123456789"


def spec(url: str, **kwargs) -> ModelSpec:
    return ModelSpec("gemini-scripted", api="google-generate-content", base_url=url, api_key=Secret(KEY), **kwargs)


async def calls(script, count: int = 1, **kwargs):
    server = ModelServer(script)
    results: list = []
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(2):
            client = gemini_client(spec(url.removesuffix("/v1") + "/v1beta"))
            for _ in range(count):
                try:
                    results.append(await client.generate("hi", **kwargs))
                except ModelError as exc:
                    results.append(exc)
        nursery.cancel_scope.cancel()
    return results, server


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_call_then_text_round_trip_with_usage(stream):
    script = [
        tool_calls([("bash", {"command": "ls -A"}, "call_a"), ("read", {"path": "x"}, "call_b")],
                   prompt_tokens=11, completion_tokens=7),
        text("all done, and a long enough text to be split", prompt_tokens=20, completion_tokens=9),
    ]  # fmt: skip
    (first, second), server = await calls(script, count=2, stream=stream, generationConfig={"temperature": 0})
    assert first.content is None
    assert [(c.id, c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("call_a", "bash", {"command": "ls -A"}),
        ("call_b", "read", {"path": "x"}),
    ]
    assert first.usage == {"prompt_tokens": 11, "completion_tokens": 7}
    assert first.output["role"] == "model" and first.finish_reason == "STOP"
    assert second.content == "all done, and a long enough text to be split" and second.tool_calls == ()
    assert second.usage == {"prompt_tokens": 20, "completion_tokens": 9}
    request = server.requests[0]
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    assert request.path == f"/v1beta/models/gemini-scripted:{method}"
    assert request.headers["x-goog-api-key"] == KEY and "authorization" not in request.headers
    assert KEY not in request.path
    assert request.json == {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": {"temperature": 0},
    }


@pytest.mark.parametrize(
    ("reply", "severity", "code"),
    [
        (error(401), "fatal", "model_auth"),
        (error(403), "fatal", "model_auth"),
        (error(404), "fatal", "model_not_found"),
        (error(429, headers={"Retry-After": "3"}), "fatal", "model_rate_limited"),
        (error(500), "fatal", "model_server_error"),
        (error(503), "fatal", "model_server_error"),
        (error(400), "error", "model_bad_request"),
        (malformed(), "error", "no_valid_output"),
        (empty_choices(), "error", "no_valid_output"),
    ],
)
async def test_failures_are_classified(reply, severity, code):
    (result,), _ = await calls([reply])
    assert isinstance(result, ModelError)
    assert (result.severity, result.code) == (severity, code)
    assert "\n" not in result.message and "gemini-scripted" in result.message
    if code == "model_server_error":
        assert "INTERNAL" in result.message or "UNAVAILABLE" in result.message  # Google's error body


async def test_an_error_chunk_inside_a_stream_is_fatal_model_server_error():
    (streamed,), _ = await calls([stream_error("overloaded now")], stream=True)
    assert isinstance(streamed, ModelError)
    assert (streamed.severity, streamed.code) == ("fatal", "model_server_error")
    assert "overloaded now" in streamed.message


async def test_an_echoed_key_never_reaches_the_message():
    (result,), server = await calls([echo_headers(500)])
    assert server.requests[0].headers["x-goog-api-key"] == KEY
    assert isinstance(result, ModelError) and KEY not in result.message and "x-goog-api-key" in result.message


async def test_the_client_is_gemini_s_own_and_names_the_model_in_one_path_segment():
    server = ModelServer([text("a")])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(1):
            client = model_client(ModelSpec("models/odd/name", api="google-generate-content", base_url=url))
            assert isinstance(client, GeminiClient)
            await client.generate("x")
            with pytest.raises(ConfigError, match="has no gemini_client"):
                gemini_client(ModelSpec("m", api="openai-chat", base_url=url))
        nursery.cancel_scope.cancel()
    assert server.requests[0].path == "/v1/models/odd%2Fname:generateContent"
    assert "x-goog-api-key" not in server.requests[0].headers  # no key: none sent


def test_a_stream_joins_text_pieces_keeps_calls_whole_and_takes_the_last_usage():
    stream = GeminiStream()
    for chunk in [
        {"candidates": [{"content": {"parts": [{"text": "thinking", "thought": True}]}}]},
        {"candidates": [{"content": {"parts": [{"text": "Hel"}]}}], "usageMetadata": {"promptTokenCount": 3}},
        {"candidates": [{"content": {"parts": [{"text": "lo"}, {"functionCall": {"name": "f", "args": {"a": 1}}}]}}]},
        {"candidates": [{"finishReason": "STOP"}],
         "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4, "thoughtsTokenCount": 2}},
    ]:  # fmt: skip
        stream.feed(chunk)
    reply = stream.result()
    assert reply.content == "Hello" and [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("f", "f", '{"a": 1}')
    ]
    assert reply.usage == {"prompt_tokens": 3, "completion_tokens": 6} and reply.finish_reason == "STOP"
    # A stream sent as one JSON array (no alt=sse) reads the same.
    assert parse_reply([{"candidates": [{"content": {"parts": [{"text": "a"}]}}]}]).content == "a"
    with pytest.raises(ReplyError) as caught:
        parse_reply({"promptFeedback": {"blockReason": "SAFETY"}})
    assert caught.value.code == "no_valid_output" and "SAFETY" in caught.value.detail


def test_a_request_s_conversation_reads_turns_calls_and_results():
    body = {
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "list"}]},
            {"role": "model", "parts": [{"text": "ok", "thought": True}, {"functionCall": {"name": "ls", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": "a"}}}]},
        ],
    }
    assert conversation(body) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "ls", "name": "ls", "arguments": "{}"}]},
        {"role": "tool", "tool_call_id": "ls", "content": '{"output": "a"}'},
    ]
