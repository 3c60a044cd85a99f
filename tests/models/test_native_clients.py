"""The ``openai-responses`` and ``anthropic-messages`` clients against the real
scripted loopback server: replies with tool calls streamed and not, each
API's auth header, SPEC 10's classification (Anthropic's 529 and an error
event inside a stream included), redaction of an echoed ``x-api-key``, and
the shared pool's endpoints."""

from __future__ import annotations

import json

import pytest
import trio

from agentcompass import ConfigError, ModelSpec, Secret
from agentcompass._models._messages_wire import MessagesStream
from agentcompass._models._responses_wire import ResponsesStream
from agentcompass._models._wire import ReplyError
from agentcompass.models import (
    MessagesClient,
    ModelError,
    ResponsesClient,
    chat_client,
    messages_client,
    model_client,
    open_model_clients,
    responses_client,
)
from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import (
    ModelServer,
    Reply,
    echo_headers,
    empty_choices,
    error,
    malformed,
    stream_error,
    text,
    tool_call,
    tool_calls,
)

KEY = "sk-ant-native-client-0123456789"
APIS = ("openai-responses", "anthropic-messages")


def spec(url: str, api: str, **kwargs) -> ModelSpec:
    return ModelSpec("scripted-model", api=api, base_url=url, api_key=Secret(KEY), **kwargs)


async def call(client: ResponsesClient | MessagesClient, text_in: str = "hi", **kwargs):
    if isinstance(client, ResponsesClient):
        return await client.create([{"role": "user", "content": [{"type": "input_text", "text": text_in}]}], **kwargs)
    return await client.create([{"role": "user", "content": text_in}], **kwargs)


async def calls(script, api: str, count: int = 1, **kwargs):
    """The replies (or ModelErrors) of ``count`` calls, and the server."""
    server = ModelServer(script)
    results: list = []
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(2):
            client = model_client(spec(url, api))
            for _ in range(count):
                try:
                    results.append(await call(client, **kwargs))
                except ModelError as exc:
                    results.append(exc)
        nursery.cancel_scope.cancel()
    return results, server


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
async def test_a_tool_call_then_text_round_trip_with_usage(api, stream):
    script = [
        tool_calls([("bash", {"command": "ls -A"}, "call_a"), ("read", {"path": "x"}, "call_b")],
                   prompt_tokens=11, completion_tokens=7),
        text("all done, and a long enough text to be split", prompt_tokens=20, completion_tokens=9),
    ]  # fmt: skip
    (first, second), server = await calls(script, api, count=2, stream=stream)
    assert first.content is None
    assert [(c.id, c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("call_a", "bash", {"command": "ls -A"}),
        ("call_b", "read", {"path": "x"}),
    ]
    assert first.usage == {"prompt_tokens": 11, "completion_tokens": 7}
    assert second.content == "all done, and a long enough text to be split" and second.tool_calls == ()
    assert second.usage == {"prompt_tokens": 20, "completion_tokens": 9}
    body = server.requests[0].json
    assert body["model"] == "scripted-model" and body.get("stream", False) is stream
    if api == "openai-responses":
        assert server.requests[0].path.endswith("/v1/responses")
        assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
        assert "x-api-key" not in server.requests[0].headers
        assert [item["type"] for item in first.output] == ["function_call", "function_call"]
        assert first.finish_reason == "completed"
    else:
        assert server.requests[0].path.endswith("/v1/messages")
        headers = server.requests[0].headers
        assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in headers
        assert body["max_tokens"] == 4096
        assert first.output["role"] == "assistant" and first.finish_reason == "tool_use"
        assert [b["type"] for b in first.output["content"]] == ["tool_use", "tool_use"]
        assert second.finish_reason == "end_turn"


async def test_the_reply_output_continues_the_conversation_in_the_apis_own_format():
    server = ModelServer([tool_call("bash", {"command": "ls"}, call_id="call_x"), text("fine")])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(2):
            client = responses_client(spec(url, "openai-responses", params={"store": False}))
            items = [{"role": "user", "content": [{"type": "input_text", "text": "go"}]}]
            reply = await client.create(items, instructions="be brief", tools=[{"type": "function", "name": "bash"}])
            items += reply.output + [{"type": "function_call_output", "call_id": "call_x", "output": "a b"}]
            final = await client.create(items, instructions="be brief", stream=True)
        nursery.cancel_scope.cancel()
    assert final.content == "fine"
    second = server.requests[1].json
    assert second["store"] is False and second["instructions"] == "be brief"
    assert [i.get("type", "message") for i in second["input"]] == ["message", "function_call", "function_call_output"]


@pytest.mark.parametrize(
    ("reply", "severity", "code"),
    [
        (error(401), "fatal", "model_auth"),
        (error(402), "fatal", "model_quota"),
        (error(404), "fatal", "model_not_found"),
        (error(429, headers={"Retry-After": "3"}), "fatal", "model_rate_limited"),
        (error(500), "fatal", "model_server_error"),
        (error(529), "fatal", "model_server_error"),
        (error(400), "error", "model_bad_request"),
        (malformed(), "error", "no_valid_output"),
        (empty_choices(), "error", "no_valid_output"),
    ],
)
@pytest.mark.parametrize("api", APIS)
async def test_failures_are_classified(api, reply, severity, code):
    (result,), _ = await calls([reply], api)
    assert isinstance(result, ModelError)
    assert (result.severity, result.code) == (severity, code)
    assert "\n" not in result.message and "scripted-model" in result.message
    if code == "model_rate_limited":
        assert result.retry_after == 3


async def test_anthropics_529_overloaded_body_is_the_apis_own():
    (result,), _ = await calls([error(529)], "anthropic-messages")
    assert (result.severity, result.code) == ("fatal", "model_server_error")
    assert "HTTP 529" in result.message and "overloaded_error" in result.message


@pytest.mark.parametrize("api", APIS)
async def test_an_error_event_inside_a_stream_is_fatal_model_server_error(api):
    (streamed,), _ = await calls([stream_error("overloaded now")], api, stream=True)
    (plain,), _ = await calls([stream_error("overloaded now")], api)
    assert isinstance(streamed, ModelError)
    assert (streamed.severity, streamed.code) == ("fatal", "model_server_error")
    assert "overloaded now" in streamed.message
    # Not streamed, the same step is an HTTP 500.
    assert (plain.code, "HTTP 500" in plain.message) == ("model_server_error", True)


def test_every_stream_error_event_of_the_responses_api_is_a_server_error():
    for event in (
        {"type": "error", "code": "server_error", "message": "boom", "sequence_number": 3},
        {"type": "response.failed", "response": {"status": "failed", "error": {"code": "x", "message": "boom"}}},
    ):
        stream = ResponsesStream()
        stream.feed({"type": "response.created", "response": {}})
        with pytest.raises(ReplyError) as caught:
            stream.feed(event)
        assert caught.value.code == "model_server_error" and "boom" in caught.value.detail
    messages = MessagesStream()
    with pytest.raises(ReplyError, match="overloaded"):
        messages.feed({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})


def test_a_messages_stream_is_assembled_from_its_blocks_and_cumulative_usage():
    stream = MessagesStream()
    events = [
        {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [],
                                              "usage": {"input_tokens": 30, "output_tokens": 1}}},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Let me "}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "look."}},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"command": '}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '"ls"}'}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}},
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 15}},
        {"type": "message_stop"},
    ]  # fmt: skip
    for event in events:
        stream.feed(event)
    reply = stream.result()
    assert reply.content == "Let me look."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("toolu_1", "Bash", {"command": "ls"})]
    assert reply.usage == {"prompt_tokens": 30, "completion_tokens": 15}
    assert reply.finish_reason == "tool_use"


@pytest.mark.parametrize("api", APIS)
async def test_an_echoed_key_never_reaches_the_message(api):
    (result,), server = await calls([echo_headers(500)], api)
    assert isinstance(result, ModelError) and result.code == "model_server_error"
    echoed = server.requests[0].headers
    assert KEY in echoed.get("x-api-key", "") + echoed.get("authorization", "")  # the probe did echo the key
    assert KEY not in result.message and KEY[:12] not in result.message
    assert "x-api-key" in result.message or "authorization" in result.message


async def test_each_api_has_its_own_client_and_the_wrong_getter_is_refused():
    server = ModelServer([text("a"), text("b"), text("c")])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(2) as pool:
            responses = responses_client(spec(url, "openai-responses"))
            again = responses_client(spec(url, "openai-responses", params={"temperature": 0}))
            messages = messages_client(spec(url, "anthropic-messages"))
            chat = chat_client(spec(url, "openai-chat"))
            assert responses.http is again.http  # one pool per endpoint, as for chat
            assert len({id(responses.http), id(messages.http), id(chat.http)}) == 3  # the key's header differs
            assert isinstance(model_client(spec(url, "anthropic-messages")), MessagesClient)
            with pytest.raises(ConfigError, match="api 'openai-chat' has no messages_client"):
                messages_client(spec(url, "openai-chat"))
            with pytest.raises(ConfigError, match="api 'none'"):
                model_client(spec(url, "none"))
            assert len(pool._http) == 3
        nursery.cancel_scope.cancel()


async def test_a_reply_with_neither_text_nor_tool_calls_is_no_valid_output():
    empty_message = Reply(body={"type": "message", "role": "assistant", "content": [], "usage": {}})
    server = ModelServer([empty_message])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(1):
            with pytest.raises(ModelError) as caught:
                await messages_client(spec(url, "anthropic-messages")).create([{"role": "user", "content": "x"}])
        nursery.cancel_scope.cancel()
    assert (caught.value.severity, caught.value.code) == ("error", "no_valid_output")
