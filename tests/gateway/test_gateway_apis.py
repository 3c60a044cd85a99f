"""The model gateway for ``openai-responses`` (``/v1/responses``) and
``anthropic-messages`` (``/v1/messages``) against the real scripted server,
reached through a `local` session's socket: bodies, unknown fields, tool
types, the beta query string and the API's headers reach the upstream
unchanged; both APIs record the same trajectory shape and usage, streamed
and not; upstream failures are classified onto the record; and the real
OpenAI and Anthropic SDKs drive it."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import sys

import httpx
import pytest
import trio

from agentcompass import ModelSpec, NetworkPolicy, Secret
from agentcompass.environments.local import LocalEnvironment
from agentcompass.gateway import open_gateway
from agentcompass.models import open_model_clients
from agentcompass.testing.model_server import echo_headers, error, stream_error, text, tool_call

KEY = "sk-ant-gateway-REAL-KEY-7c1e"


def _client(gateway) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=gateway.socket_path)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway")


def _messages_body(messages, **extra):
    return {"model": "scripted", "max_tokens": 64, "messages": messages, **extra}


async def test_messages_pass_through_with_beta_query_headers_and_unknown_fields(setup):
    server, model, env = await setup([tool_call("Bash", {"command": "ls"}, call_id="toolu_1")], "anthropic-messages")
    body = _messages_body(
        [{"role": "user", "content": [{"type": "text", "text": "list files"}]}],
        system=[{"type": "text", "text": "You are Claude Code."}],
        tools=[{"name": "Bash", "input_schema": {"type": "object"}}, {"type": "web_search_20250305", "name": "web_search"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        context_management={"edits": []},
        output_config={"effort": "high"},
        metadata={"user_id": "u"},
    )
    raw = json.dumps(body, separators=(",", ":")).encode()
    headers = {"x-api-key": "", "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,oauth"}
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        probe = await client.head("/")
        headers["x-api-key"] = gateway.token
        reply = await client.post("/v1/messages?beta=true", content=raw, headers=headers)
    assert probe.status_code == 200 and gateway.record.calls == 1  # the probe is no call
    assert reply.status_code == 200 and reply.json()["content"][0]["type"] == "tool_use"
    (seen,) = server.requests
    assert seen.body == raw  # byte for byte: thinking, context_management, output_config, tool types
    assert seen.path == "/v1/messages?beta=true"
    assert seen.headers["anthropic-beta"] == "claude-code-20250219,oauth"
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["x-api-key"] == KEY and gateway.token not in json.dumps(seen.headers)
    record = gateway.record
    assert record.trajectory[:2] == [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "list files"},
    ]
    entry = record.trajectory[2]
    assert (entry["role"], entry["call"], entry["status"], entry["content"]) == ("assistant", 1, 200, None)
    assert entry["tool_calls"] == [{"id": "toolu_1", "name": "Bash", "arguments": '{"command": "ls"}'}]
    assert record.usage.to_dict() == {"prompt_tokens": 10, "completion_tokens": 5, "calls": 1, "cost_usd": None}


async def test_a_streamed_messages_conversation_records_only_what_each_call_adds(setup):
    script = [
        tool_call("Bash", {"command": "cat hello.txt"}, call_id="toolu_9", prompt_tokens=12, completion_tokens=4),
        text("The file says hello.", prompt_tokens=30, completion_tokens=6),
    ]
    server, model, env = await setup(script, "anthropic-messages")
    history = [{"role": "user", "content": "read hello.txt"}]
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        auth = {"Authorization": f"Bearer {gateway.token}"}
        async with client.stream("POST", "/v1/messages", json=_messages_body(history, stream=True), headers=auth) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line async for line in r.aiter_lines() if line.startswith("event:")]
        assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
        history += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "Bash",
                                               "input": {"command": "cat hello.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "hello"},
                                         {"type": "text", "text": "<system-reminder>keep going</system-reminder>"}]},
        ]  # fmt: skip
        second = await client.post("/v1/messages", json=_messages_body(history, stream=True), headers=auth)
        assert second.status_code == 200
    trajectory = gateway.record.trajectory
    assert [(e["role"], e.get("call")) for e in trajectory] == [
        ("user", None), ("assistant", 1), ("tool", None), ("user", None), ("assistant", 2),
    ]  # fmt: skip
    assert trajectory[1]["tool_calls"] == [{"id": "toolu_9", "name": "Bash", "arguments": '{"command": "cat hello.txt"}'}]
    assert trajectory[2] == {"role": "tool", "tool_call_id": "toolu_9", "content": "hello"}
    assert trajectory[4]["content"] == "The file says hello." and trajectory[4]["usage"] == {
        "prompt_tokens": 30, "completion_tokens": 6,
    }  # fmt: skip
    assert gateway.record.usage.to_dict() == {
        "prompt_tokens": 42,
        "completion_tokens": 10,
        "calls": 2,
        "cost_usd": None,
    }
    assert gateway.record.issues == []


def _responses_body(items, **extra):
    return {"model": "scripted", "instructions": "You are Codex.", "input": items, "store": False, **extra}


async def test_responses_pass_through_unknown_tool_types_and_record_resent_history_once(setup):
    script = [
        tool_call("shell", {"command": ["ls"]}, call_id="call_1", prompt_tokens=100, completion_tokens=8),
        text("Done.", prompt_tokens=150, completion_tokens=3),
    ]
    server, model, env = await setup(script, "openai-responses")
    tools = [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "mcp", "tools": []},
        {"type": "web_search", "external_web_access": False},
    ]
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: none"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
    ]
    first_raw = json.dumps(_responses_body(items, tools=tools, stream=True, prompt_cache_key="k")).encode()
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        auth = {"Authorization": f"Bearer {gateway.token}", "OpenAI-Beta": "responses=experimental"}
        first = await client.post("/v1/responses", content=first_raw, headers=auth)
        completed = [json.loads(line[5:]) for line in first.text.splitlines() if line.startswith("data:")][-1]
        assert completed["type"] == "response.completed"
        items += [
            {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
            *completed["response"]["output"],
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt b.txt"},
        ]
        second = await client.post("/v1/responses", json=_responses_body(items, tools=tools), headers=auth)
    assert second.status_code == 200 and second.json()["output"][0]["content"][0]["text"] == "Done."
    assert server.requests[0].body == first_raw  # namespace and web_search tools, unknown fields, unchanged
    assert server.requests[0].headers["openai-beta"] == "responses=experimental"
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    trajectory = gateway.record.trajectory
    assert [(e["role"], e.get("call")) for e in trajectory] == [
        ("system", None), ("developer", None), ("user", None), ("assistant", 1), ("tool", None), ("assistant", 2),
    ]  # fmt: skip
    assert trajectory[3]["tool_calls"] == [{"id": "call_1", "name": "shell", "arguments": '{"command": ["ls"]}'}]
    assert trajectory[4] == {"role": "tool", "tool_call_id": "call_1", "content": "a.txt b.txt"}
    assert trajectory[5]["content"] == "Done." and trajectory[5]["status"] == 200
    assert gateway.record.usage.to_dict() == {
        "prompt_tokens": 250,
        "completion_tokens": 11,
        "calls": 2,
        "cost_usd": None,
    }


@pytest.mark.parametrize(("api", "route"), [("anthropic-messages", "/v1/messages"), ("openai-responses", "/v1/responses")])
@pytest.mark.parametrize("status", [500, 529])
async def test_an_upstream_5xx_is_fatal_model_server_error_on_the_record(setup, api, route, status):
    server, model, env = await setup([error(status)], api)
    body = _messages_body([{"role": "user", "content": "hi"}]) if api == "anthropic-messages" else _responses_body("hi")
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        reply = await client.post(route, json=body, headers={"x-api-key": gateway.token})
    assert reply.status_code == status  # the agent sees the upstream's reply as it was
    if api == "anthropic-messages":
        assert reply.json()["error"]["type"] == ("overloaded_error" if status == 529 else "api_error")
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code, issue.phase) == ("fatal", "model_server_error", "run")
    assert f"HTTP {status}" in issue.message and KEY not in issue.message
    assert gateway.record.trajectory[-1]["status"] == status and gateway.record.usage.calls == 0


@pytest.mark.parametrize(("api", "route"), [("anthropic-messages", "/v1/messages"), ("openai-responses", "/v1/responses")])
async def test_an_error_event_in_a_relayed_stream_is_fatal_model_server_error(setup, api, route):
    server, model, env = await setup([stream_error("overloaded midway")], api)
    body = _messages_body([{"role": "user", "content": "hi"}]) if api == "anthropic-messages" else _responses_body("hi")
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        reply = await client.post(route, json={**body, "stream": True}, headers={"x-api-key": gateway.token})
    assert reply.status_code == 200 and "overloaded midway" in reply.text  # relayed as it came
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code) == ("fatal", "model_server_error")
    assert "overloaded midway" in issue.message


async def test_an_upstream_echoing_the_real_x_api_key_leaks_it_to_neither_agent_nor_record(setup):
    server, model, env = await setup([echo_headers(500)], "anthropic-messages")
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        reply = await client.post("/v1/messages", json=_messages_body([]), headers={"x-api-key": gateway.token})
    assert server.requests[0].headers["x-api-key"] == KEY
    assert reply.json()["error"]["headers"]["x-api-key"] == "**********"  # the session never sees the key
    (issue,) = gateway.record.issues
    assert issue.code == "model_server_error" and "x-api-key" in issue.message
    assert KEY not in issue.message and KEY not in json.dumps(gateway.record.trajectory)


async def test_past_max_model_calls_messages_get_429_in_anthropics_error_shape(setup):
    server, model, env = await setup([text("1"), text("2")], "anthropic-messages")
    body = _messages_body([{"role": "user", "content": "hi"}])
    async with open_gateway(env, model, max_model_calls=1) as gateway, _client(gateway) as client:
        replies = [await client.post("/v1/messages", json=body, headers={"x-api-key": gateway.token}) for _ in range(2)]
    assert [r.status_code for r in replies] == [200, 429]
    assert replies[1].json()["type"] == "error" and replies[1].json()["error"]["type"] == "harness_limit_reached"
    assert len(server.requests) == 1
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code) == ("error", "harness_limit_reached")


async def test_the_other_apis_route_is_not_served(setup):
    server, model, env = await setup([text("never")], "anthropic-messages")
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        chat = await client.post("/v1/chat/completions", json={"messages": []}, headers={"x-api-key": gateway.token})
        unauthorized = await client.post("/v1/messages", json={"messages": []}, headers={"x-api-key": "guess"})
    assert chat.status_code == 404 and unauthorized.status_code == 401
    assert unauthorized.json()["error"]["type"] == "authentication_error"
    assert server.requests == [] and gateway.record.calls == 0


@contextlib.asynccontextmanager
async def _forwarded(gateway):
    """The gateway on a loopback TCP port, through the forwarder a session runs
    (the SDKs bring an HTTP client of their own, with no unix sockets)."""
    started = await trio.run_process(
        [sys.executable, gateway.forwarder, gateway.socket_path], capture_stdout=True, check=True
    )
    port, pid = started.stdout.split()
    try:
        yield f"http://127.0.0.1:{port.decode()}/v1"
    finally:
        os.kill(int(pid), signal.SIGTERM)


async def test_the_anthropic_sdk_streams_a_tool_call_through_the_gateway(setup):
    anthropic = pytest.importorskip("anthropic")
    server, model, env = await setup(
        [tool_call("Bash", {"command": "ls"}, call_id="toolu_5"), text("Listed.")], "anthropic-messages"
    )
    async with open_gateway(env, model) as gateway, _forwarded(gateway) as url:
        # Anthropic's SDK appends /v1/messages to its base URL; the gateway serves any prefix.
        client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=gateway.token, max_retries=0)

        def converse():
            messages = [{"role": "user", "content": "list files"}]
            tools = [{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
            with client.messages.stream(model="scripted", max_tokens=64, messages=messages, tools=tools) as stream:
                first = stream.get_final_message()
            messages += [
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": "a"}]},
            ]
            with client.messages.stream(model="scripted", max_tokens=64, messages=messages, tools=tools) as stream:
                return first, stream.get_final_message()

        first, second = await trio.to_thread.run_sync(converse)
    assert first.stop_reason == "tool_use" and first.content[0].input == {"command": "ls"}
    assert first.usage.input_tokens == 10 and first.usage.output_tokens == 5
    assert second.content[0].text == "Listed." and second.stop_reason == "end_turn"
    roles = [(e["role"], e.get("call")) for e in gateway.record.trajectory]
    assert roles == [("user", None), ("assistant", 1), ("tool", None), ("assistant", 2)]
    # The SDK's own API version reaches the upstream, not the client's default.
    assert server.requests[0].headers["anthropic-version"] == client.default_headers["anthropic-version"]


async def test_the_openai_sdk_streams_a_tool_call_through_the_gateway(setup):
    openai = pytest.importorskip("openai")
    server, model, env = await setup([tool_call("shell", {"command": "ls"}, call_id="call_7"), text("Listed.")],
                                     "openai-responses")  # fmt: skip
    async with open_gateway(env, model) as gateway, _forwarded(gateway) as url:
        client = openai.OpenAI(base_url=url, api_key=gateway.token, max_retries=0)

        def converse():
            tools = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]
            items = [{"role": "user", "content": [{"type": "input_text", "text": "list files"}]}]
            with client.responses.stream(model="scripted", input=items, tools=tools, store=False) as stream:
                first = stream.get_final_response()
            call = first.output[0]
            items += [call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id, "output": "a"}]
            with client.responses.stream(model="scripted", input=items, tools=tools, store=False) as stream:
                deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
                return first, stream.get_final_response(), deltas

        first, second, deltas = await trio.to_thread.run_sync(converse)
    (call,) = first.output
    assert (call.type, call.call_id, call.name, json.loads(call.arguments)) == ("function_call", "call_7", "shell", {"command": "ls"})
    assert first.usage.input_tokens == 10 and first.usage.output_tokens == 5
    assert second.output_text == "Listed." and "".join(deltas) == "Listed."
    roles = [(e["role"], e.get("call")) for e in gateway.record.trajectory]
    assert roles == [("user", None), ("assistant", 1), ("tool", None), ("assistant", 2)]
    assert gateway.record.usage.to_dict() == {
        "prompt_tokens": 20,
        "completion_tokens": 10,
        "calls": 2,
        "cost_usd": None,
    }


async def test_a_compressed_upstream_stream_reaches_the_agent_and_the_record_decoded(tmp_path):
    from agentcompass._asgi import lifespan, listen, serve_asgi
    from agentcompass.testing._messages_render import message_events

    events = b"".join(message_events(text("compressed words").body, 4))

    async def upstream(scope, receive, send):
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"text/event-stream"), (b"content-encoding", b"gzip")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": gzip.compress(events)})

    async with trio.open_nursery() as nursery, open_model_clients(1):
        listener = listen()
        await nursery.start(serve_asgi, upstream, listener)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        model = ModelSpec(name="scripted", api="anthropic-messages", base_url=url, api_key=Secret(KEY))
        env = await LocalEnvironment({"root": str(tmp_path)}).open(None, NetworkPolicy("full"), "gw-gzip")
        try:
            async with open_gateway(env, model) as gateway, _client(gateway) as client:
                body = _messages_body([{"role": "user", "content": "hi"}], stream=True)
                reply = await client.post("/v1/messages", json=body, headers={"x-api-key": gateway.token})
        finally:
            await env.close()
        nursery.cancel_scope.cancel()
    assert reply.content == events  # no Content-Encoding relayed, so the bytes are the events themselves
    assert gateway.record.trajectory[-1]["content"] == "compressed words" and gateway.record.issues == []
