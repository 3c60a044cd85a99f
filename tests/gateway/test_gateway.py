"""The model gateway against a real scripted server, reached through a `local`
session's socket (and, once, through the in-session forwarder): bodies pass
unchanged, the real key stays in the runtime, failures are classified onto
the record, ``max_model_calls`` is enforced and the token dies with the block."""

from __future__ import annotations

import json
import os

import attrs
import httpx
import pytest

from agentcompass.gateway import open_gateway
from agentcompass.testing.model_server import error, text, tool_call

KEY = "sk-gateway-test-REAL-KEY-9f3a"


def _client(gateway) -> httpx.AsyncClient:
    # `local` exposes the host path itself: the test talks to the socket as the session would.
    transport = httpx.AsyncHTTPTransport(uds=gateway.socket_path)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway/v1")


def _auth(gateway) -> dict[str, str]:
    return {"Authorization": f"Bearer {gateway.token}"}


async def test_a_call_passes_through_unchanged_and_is_recorded(setup):
    server, model, env = await setup([tool_call("bash", {"command": "ls"}, prompt_tokens=7, completion_tokens=3)])
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "list files"}]}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
        "x_unknown_field": {"kept": True},
    }
    raw = json.dumps(body, separators=(",", ":")).encode()
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        reply = await client.post("/chat/completions", content=raw, headers=_auth(gateway))
        models = await client.get("/models", headers=_auth(gateway))
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash"
    assert [m["id"] for m in models.json()["data"]] == ["scripted"]
    (seen,) = server.requests
    assert seen.body == raw  # byte for byte, the unknown field included
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    record = gateway.record
    assert record.usage.to_dict() == {"prompt_tokens": 7, "completion_tokens": 3, "calls": 1, "cost_usd": None}
    assert record.trajectory[0] == {"role": "user", "content": "list files"}
    reply_entry = record.trajectory[1]
    assert reply_entry["role"] == "assistant" and reply_entry["call"] == 1 and reply_entry["status"] == 200
    assert reply_entry["tool_calls"] == [{"id": reply_entry["tool_calls"][0]["id"], "name": "bash", "arguments": '{"command": "ls"}'}]
    assert record.issues == []


async def test_a_streamed_call_is_relayed_as_events_and_recorded(setup):
    server, model, env = await setup([text("streamed words here", prompt_tokens=4, completion_tokens=6)])
    body = {"model": "scripted", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        async with client.stream("POST", "/chat/completions", json=body, headers=_auth(gateway)) as reply:
            assert reply.headers["content-type"].startswith("text/event-stream")
            events = [line async for line in reply.aiter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and len(events) > 3
    entry = gateway.record.trajectory[-1]
    assert entry["content"] == "streamed words here"
    assert gateway.record.usage.to_dict() == {"prompt_tokens": 4, "completion_tokens": 6, "calls": 1, "cost_usd": None}


async def test_a_wrong_or_missing_token_is_refused_and_never_forwarded(setup):
    server, model, env = await setup([text("never")])
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        body = {"model": "scripted", "messages": []}
        missing = await client.post("/chat/completions", json=body)
        wrong = await client.post("/chat/completions", json=body, headers={"Authorization": "Bearer acgw-guess"})
        models = await client.get("/models", headers={"x-api-key": "nope"})
    assert missing.status_code == wrong.status_code == models.status_code == 401
    assert server.requests == [] and gateway.record.calls == 0


async def test_an_upstream_500_is_fatal_model_server_error_on_the_record(setup):
    server, model, env = await setup([text("one"), error(500)])
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        first = await client.post("/chat/completions", json=body, headers=_auth(gateway))
        second = await client.post("/chat/completions", json=body, headers=_auth(gateway))
    assert (first.status_code, second.status_code) == (200, 500)
    assert second.json()["error"]["message"] == "scripted HTTP 500"  # the agent sees the upstream's reply
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code, issue.phase) == ("fatal", "model_server_error", "run")
    assert KEY not in issue.message


async def test_past_max_model_calls_the_gateway_answers_429_and_records_the_limit(setup):
    server, model, env = await setup([text("1"), text("2"), text("3")])
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    async with open_gateway(env, model, max_model_calls=2) as gateway, _client(gateway) as client:
        statuses = [(await client.post("/chat/completions", json=body, headers=_auth(gateway))).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert len(server.requests) == 2
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code) == ("error", "harness_limit_reached")


async def test_the_token_and_socket_die_with_the_block(setup):
    server, model, env = await setup([text("1")])
    async with open_gateway(env, model) as gateway:
        path = gateway.socket_path
        assert os.path.exists(path)
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
    with pytest.raises(httpx.ConnectError):
        async with _client(gateway) as client:
            await client.post("/chat/completions", json={}, headers=_auth(gateway))


async def test_the_forwarder_serves_the_gateway_on_the_sessions_loopback(setup):
    server, model, env = await setup([text("through the forwarder")])
    async with open_gateway(env, model) as gateway:
        call = (
            'curl -s -H "Authorization: Bearer $AGENTCOMPASS_GATEWAY_TOKEN" -H "Content-Type: application/json" '
            """-d '{"model":"scripted","messages":[{"role":"user","content":"hi"}]}' """
            '"$AGENTCOMPASS_GATEWAY_URL/chat/completions"; echo " $AGENTCOMPASS_GATEWAY_URL"'
        )
        result = await env.exec(gateway.command(call), timeout=60)
    assert result.exit_code == 0, result
    reply, url = result.stdout.rsplit(" ", 1)
    assert json.loads(reply)["choices"][0]["message"]["content"] == "through the forwarder"
    assert url.startswith("http://127.0.0.1:") and url.strip().endswith("/v1")
    assert gateway.record.calls == 1 and KEY not in result.stdout


async def test_an_oversized_body_is_refused_before_anything_is_forwarded(setup):
    server, model, env = await setup([text("never")])
    from agentcompass._gateway._app import MAX_BODY_BYTES

    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        reply = await client.post("/chat/completions", content=b"x" * (MAX_BODY_BYTES + 1), headers=_auth(gateway))
    assert reply.status_code == 413
    assert server.requests == [] and gateway.record.calls == 0


def test_a_streamed_reply_with_tool_calls_is_assembled_for_the_record():
    from agentcompass._gateway._apis import API_OF

    parse_stream = API_OF["openai-chat"].stream

    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "ba"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "sh", "arguments": '{"co'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": 7, "arguments": 'mmand": "ls"}'}}]}}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ]
    data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    reply = parse_stream(data.encode())
    assert reply.content is None
    assert [attrs.asdict(c) for c in reply.tool_calls] == [{"id": "c1", "name": "bash", "arguments": '{"command": "ls"}'}]
    assert reply.usage == {"prompt_tokens": 3, "completion_tokens": 2}
