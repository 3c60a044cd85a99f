"""The ``openai-chat`` client against a real loopback server: every row of the
classification table (SPEC 10), request shape, shared pool, cancellation."""

from __future__ import annotations

import socket

import pytest
import trio
from _http_support import RawServer, completion, raw_serving, read_request, response

from agentcompass import ConfigError, ModelSpec, Secret
from agentcompass.models import ModelError, chat_client, open_model_clients
from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import (
    ModelServer,
    Reply,
    empty_choices,
    error,
    malformed,
    text,
    tool_call,
)

KEY = "sk-test-client-0123456789"
MESSAGES = [{"role": "user", "content": "hi"}]


def spec(url: str, **kwargs) -> ModelSpec:
    return ModelSpec("scripted-model", base_url=url, api_key=Secret(KEY), **kwargs)


async def one_call(script, **spec_kwargs):
    """(ModelError or reply, server) of one call against a server with ``script``."""
    server = ModelServer(script)
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(4):
            try:
                result = await chat_client(spec(url, **spec_kwargs)).chat(MESSAGES)
            except ModelError as exc:
                result = exc
        nursery.cancel_scope.cancel()
    return result, server


@pytest.mark.parametrize(
    ("reply", "severity", "code"),
    [
        (error(401), "fatal", "model_auth"),
        (error(403), "fatal", "model_auth"),
        (error(402), "fatal", "model_quota"),
        (error(404), "fatal", "model_not_found"),
        (error(429), "fatal", "model_rate_limited"),
        (error(500), "fatal", "model_server_error"),
        (error(503), "fatal", "model_server_error"),
        (error(400), "error", "model_bad_request"),
        (empty_choices(), "error", "no_valid_output"),
        (malformed(), "error", "no_valid_output"),
        (Reply(body={"choices": [{"message": {"role": "assistant", "content": None}}]}), "error", "no_valid_output"),
    ],
    ids=["401", "403", "402", "404", "429", "500", "503", "400", "empty-choices", "malformed-json", "no-content"],
)
async def test_status_and_body_classification(reply, severity, code):
    exc, server = await one_call([reply])
    assert isinstance(exc, ModelError)
    assert (exc.severity, exc.code) == (severity, code)
    assert "scripted-model" in exc.message and "\n" not in exc.message
    issue = exc.to_issue("run")
    assert (issue.severity, issue.code, issue.phase) == (severity, code, "run")
    assert len(server.requests) == 1  # the client never retries by itself


async def test_429_carries_retry_after_seconds_and_http_date():
    exc, _ = await one_call([error(429, headers={"Retry-After": "7"})])
    assert exc.retry_after == 7.0 and exc.to_issue("run").retry_after_seconds == 7.0
    exc, _ = await one_call([error(429, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})])
    assert exc.retry_after == 0.0  # a date in the past: no wait asked
    exc, _ = await one_call([error(429)])
    assert exc.retry_after is None and exc.to_issue("run").retry_after_seconds is None


async def test_connection_refused_is_fatal_unreachable():
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with hang_guard(20), open_model_clients(2):
        with pytest.raises(ModelError) as info:
            await chat_client(spec(f"http://127.0.0.1:{port}/v1")).chat(MESSAGES)
    assert (info.value.severity, info.value.code) == ("fatal", "model_unreachable")


async def test_read_timeout_is_error_model_timeout():
    # The timeout also bounds connecting: leave a loaded host time to connect.
    exc, server = await one_call([text("late").after(15)], timeout_seconds=1.5)
    assert isinstance(exc, ModelError)
    assert (exc.severity, exc.code) == ("error", "model_timeout")
    assert "1.5s" in exc.message


async def test_reply_text_tool_calls_usage_and_request_shape():
    server = ModelServer(
        [text("hello", prompt_tokens=11, completion_tokens=3), tool_call("bash", {"command": "ls"}, call_id="c1")]
    )
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(4):
            client = chat_client(spec(url, params={"temperature": 0.2, "max_tokens": 64}))
            first = await client.chat(MESSAGES)
            second = await client.chat(MESSAGES, tools=[{"type": "function", "function": {"name": "bash"}}], seed=3)
        nursery.cancel_scope.cancel()
    assert (first.content, first.tool_calls, first.usage) == (
        "hello",
        (),
        {"prompt_tokens": 11, "completion_tokens": 3},
    )
    assert second.content is None
    assert [(c.id, c.name, c.arguments) for c in second.tool_calls] == [("c1", "bash", '{"command": "ls"}')]
    assert second.message["tool_calls"][0]["function"]["name"] == "bash"
    body0, body1 = server.requests[0].json, server.requests[1].json
    assert server.requests[0].path == "/v1/chat/completions"
    assert body0 == {"model": "scripted-model", "messages": MESSAGES, "temperature": 0.2, "max_tokens": 64}
    assert body1["tools"][0]["function"]["name"] == "bash" and body1["seed"] == 3
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    # Both calls shared one keep-alive connection of the endpoint's pool.
    assert server.connections == 1


async def test_clients_share_one_http_client_per_endpoint():
    async with open_model_clients(8) as pool:
        a = chat_client(ModelSpec("a", base_url="http://127.0.0.1:9/v1", params={"temperature": 0}))
        b = chat_client(ModelSpec("b", base_url="http://127.0.0.1:9/v1"))
        c = chat_client(ModelSpec("c", base_url="http://127.0.0.1:9/v1", max_connections=2))
        assert a.http is b.http and a.http is not c.http
    assert pool.closed and a.http.is_closed and c.http.is_closed


async def test_chat_client_refuses_specs_without_an_endpoint_and_outside_an_orchestration():
    with pytest.raises(RuntimeError, match="orchestration"):
        chat_client(ModelSpec("m", base_url="http://127.0.0.1:9/v1"))
    async with open_model_clients(1):
        with pytest.raises(ConfigError, match="base_url"):
            chat_client(ModelSpec("m"))
        with pytest.raises(ConfigError, match="api 'none'"):
            chat_client(ModelSpec("m", api="none", base_url="http://127.0.0.1:9/v1"))


async def test_cancelling_a_call_mid_request_closes_its_connection():
    server = ModelServer([text("never sent").after(30), text("second")])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(1):
            client = chat_client(spec(url))
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as calls:
                    calls.start_soon(client.chat, MESSAGES)
                    await server.wait_until(lambda s: bool(s.requests))  # the request reached the server
                    scope.cancel()
            # The server sees the client close the connection while the reply is pending.
            await server.wait_until(lambda s: s.aborted == 1)
            # The pool (of one connection) is usable again: a new connection serves the next call.
            reply = await client.chat(MESSAGES)
            assert reply.content == "second" and server.connections == 2
        nursery.cancel_scope.cancel()


async def test_closing_the_pool_closes_the_http_clients():
    ended = trio.Event()

    async def keep_alive(stream: trio.SocketStream, server: RawServer) -> None:
        buffer = bytearray()
        while await read_request(stream, buffer) is not None:
            await stream.send_all(response(completion("a")))
        ended.set()  # the client closed its keep-alive connection

    async with hang_guard(20), raw_serving(keep_alive) as (_, port):
        url = f"http://127.0.0.1:{port}/v1"
        async with open_model_clients(2):
            client = chat_client(spec(url))
            await client.chat(MESSAGES)
        assert client.http.is_closed
        with pytest.raises(RuntimeError):
            await client.http.post(url + "/chat/completions", json={})
        await ended.wait()


async def test_the_pool_holds_at_most_max_connections_and_reuses_them():
    server = ModelServer([text(str(i)).after(0.05) for i in range(6)])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with open_model_clients(16):
            client = chat_client(spec(url, max_connections=2))
            replies = []

            async def call():
                replies.append((await client.chat(MESSAGES)).content)

            async with trio.open_nursery() as calls:
                for _ in range(6):
                    calls.start_soon(call)
        nursery.cancel_scope.cancel()
    assert sorted(replies) == [str(i) for i in range(6)]
    assert server.connections == 2  # six calls, two connections, each reused
