"""The model gateway for ``google-generate-content``
(``/v1beta/models/NAME:generateContent`` and ``:streamGenerateContent``)
against the real scripted server, reached through a `local` session's
socket: the agent's token as ``x-goog-api-key`` or ``?key=`` (neither
forwarded; the upstream gets the real key in its header), bodies passed
through, the request model named upstream, trajectory and usage from
``usageMetadata`` streamed and not, upstream failures classified; and the
real Google GenAI SDK drives it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import httpx
import pytest
import trio

from agentcompass.gateway import open_gateway
from agentcompass.testing.model_server import echo_headers, error, stream_error, text, tool_call

KEY = "AIzaSy-gateway-REAL-KEY-5d2f"


def _client(gateway) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=gateway.socket_path)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway")


def _gemini(url: str) -> str:
    """The scripted server's URL as a Gemini ``base_url`` (its version root)."""
    return url.removesuffix("/v1") + "/v1beta"


async def _setup(setup, script):
    server, model, env = await setup(script, "google-generate-content")
    import attrs

    return server, attrs.evolve(model, name="gemini-scripted", base_url=_gemini(model.base_url)), env


def _body(contents, **extra):
    return {"contents": contents, **extra}


async def test_a_call_with_the_token_as_key_query_is_passed_through_with_the_real_key_in_its_header(setup):
    server, model, env = await _setup(setup, [tool_call("run_shell", {"command": "ls"}, call_id="c1")])
    body = _body(
        [{"role": "user", "parts": [{"text": "list files"}]}],
        systemInstruction={"parts": [{"text": "You are Gemini CLI."}]},
        tools=[
            {"functionDeclarations": [{"name": "run_shell", "parameters": {"type": "OBJECT"}}]},
            {"googleSearch": {}},
        ],
        generationConfig={"thinkingConfig": {"thinkingBudget": 0}},
        unknownField=1,
    )
    raw = json.dumps(body, separators=(",", ":")).encode()
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        # The agent may name another model: the gateway serves the request's.
        reply = await client.post(f"/v1beta/models/gemini-2.5-pro:generateContent?key={gateway.token}", content=raw)
    assert reply.status_code == 200
    assert reply.json()["candidates"][0]["content"]["parts"][0]["functionCall"]["name"] == "run_shell"
    (seen,) = server.requests
    assert seen.body == raw  # byte for byte
    assert seen.path == "/v1beta/models/gemini-scripted:generateContent"  # no key= in the query
    assert seen.headers["x-goog-api-key"] == KEY and gateway.token not in json.dumps(seen.headers)
    record = gateway.record
    assert record.trajectory[:2] == [
        {"role": "system", "content": "You are Gemini CLI."},
        {"role": "user", "content": "list files"},
    ]
    entry = record.trajectory[2]
    assert (entry["role"], entry["call"], entry["status"], entry["content"]) == ("assistant", 1, 200, None)
    assert entry["tool_calls"] == [{"id": "c1", "name": "run_shell", "arguments": '{"command": "ls"}'}]
    assert record.usage.to_dict() == {"prompt_tokens": 10, "completion_tokens": 5, "calls": 1, "cost_usd": None}


async def test_a_streamed_conversation_is_relayed_as_events_and_records_what_each_call_adds(setup):
    script = [
        tool_call("read_file", {"path": "hello.txt"}, call_id="c9", prompt_tokens=12, completion_tokens=4),
        text("The file says hello.", prompt_tokens=30, completion_tokens=6),
    ]
    server, model, env = await _setup(setup, script)
    history = [{"role": "user", "parts": [{"text": "read hello.txt"}]}]
    route = "/v1beta/models/gemini-scripted:streamGenerateContent?alt=sse"
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        auth = {"x-goog-api-key": gateway.token}
        async with client.stream("POST", route, json=_body(history), headers=auth) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[5:]) async for line in r.aiter_lines() if line.startswith("data:")]
        assert events[-1]["candidates"][0]["finishReason"] == "STOP"
        call = events[0]["candidates"][0]["content"]
        history += [
            call,
            {
                "role": "user",
                "parts": [{"functionResponse": {"id": "c9", "name": "read_file", "response": {"output": "hello"}}}],
            },
        ]
        second = await client.post(route, json=_body(history), headers=auth)
        assert second.status_code == 200
    assert server.requests[0].path == route  # alt=sse kept, so the upstream streams events
    trajectory = gateway.record.trajectory
    assert [(e["role"], e.get("call")) for e in trajectory] == [
        ("user", None), ("assistant", 1), ("tool", None), ("assistant", 2),
    ]  # fmt: skip
    assert trajectory[1]["tool_calls"] == [{"id": "c9", "name": "read_file", "arguments": '{"path": "hello.txt"}'}]
    assert trajectory[2] == {"role": "tool", "tool_call_id": "c9", "content": '{"output": "hello"}'}
    assert trajectory[3]["content"] == "The file says hello."
    assert gateway.record.usage.to_dict() == {"prompt_tokens": 42, "completion_tokens": 10, "calls": 2, "cost_usd": None}
    assert gateway.record.issues == []


@pytest.mark.parametrize("status", [500, 503])
async def test_an_upstream_5xx_is_fatal_model_server_error_on_the_record(setup, status):
    server, model, env = await _setup(setup, [error(status)])
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        reply = await client.post(
            "/v1beta/models/m:generateContent", json=_body("hi"), headers={"x-goog-api-key": gateway.token}
        )
    assert reply.status_code == status and reply.json()["error"]["code"] == status  # as the upstream sent it
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code, issue.phase) == ("fatal", "model_server_error", "run")
    assert f"HTTP {status}" in issue.message and KEY not in issue.message
    assert gateway.record.usage.calls == 0


async def test_an_error_chunk_in_a_relayed_stream_is_fatal_model_server_error(setup):
    server, model, env = await _setup(setup, [stream_error("overloaded midway")])
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        reply = await client.post(
            "/v1beta/models/m:streamGenerateContent?alt=sse",
            json=_body("hi"),
            headers={"x-goog-api-key": gateway.token},
        )
    assert reply.status_code == 200 and "overloaded midway" in reply.text
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code) == ("fatal", "model_server_error")


async def test_an_upstream_echoing_the_real_key_leaks_it_to_neither_agent_nor_record(setup):
    server, model, env = await _setup(setup, [echo_headers(500)])
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        reply = await client.post(f"/v1beta/models/m:generateContent?key={gateway.token}", json=_body("hi"))
    assert server.requests[0].headers["x-goog-api-key"] == KEY
    assert KEY not in reply.text and reply.json()["error"]["headers"]["x-goog-api-key"] == "**********"
    assert KEY not in json.dumps(gateway.record.trajectory) and KEY not in gateway.record.issues[0].message


async def test_a_wrong_token_a_wrong_route_and_max_model_calls_answer_in_googles_error_shape(setup):
    server, model, env = await _setup(setup, [text("1"), text("2")])
    route = "/v1beta/models/m:generateContent"
    async with open_gateway(env, model, max_model_calls=1) as gateway, _client(gateway) as client:
        wrong = await client.post(route + "?key=guess", json=_body("hi"))
        chat = await client.post("/v1/chat/completions", json={}, headers={"x-goog-api-key": gateway.token})
        replies = [
            await client.post(route, json=_body("hi"), headers={"x-goog-api-key": gateway.token}) for _ in range(2)
        ]
    assert wrong.status_code == 401 and wrong.json()["error"]["status"] == "UNAUTHENTICATED"
    assert chat.status_code == 404 and chat.json()["error"]["status"] == "NOT_FOUND"
    assert [r.status_code for r in replies] == [200, 429]
    assert replies[1].json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert len(server.requests) == 1
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code) == ("error", "harness_limit_reached")


@contextlib.asynccontextmanager
async def _forwarded(gateway):
    """The gateway on a loopback TCP port, through the forwarder a session runs."""
    started = await trio.run_process(
        [sys.executable, gateway.forwarder, gateway.socket_path], capture_stdout=True, check=True
    )
    port, pid = started.stdout.split()
    try:
        yield f"http://127.0.0.1:{port.decode()}"
    finally:
        os.kill(int(pid), signal.SIGTERM)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_google_genai_sdk_drives_a_tool_call_through_the_gateway(setup, stream):
    genai = pytest.importorskip("google.genai")
    from google.genai import types

    server, model, env = await _setup(setup, [tool_call("run_shell", {"command": "ls"}, call_id="c5"), text("Listed.")])
    async with open_gateway(env, model) as gateway, _forwarded(gateway) as origin:
        options = types.HttpOptions(
            base_url=origin, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)
        )
        client = genai.Client(api_key=gateway.token, http_options=options)
        shell = types.FunctionDeclaration(
            name="run_shell",
            parameters=types.Schema(type="OBJECT", properties={"command": types.Schema(type="STRING")}),
        )
        config = types.GenerateContentConfig(
            tools=[types.Tool(function_declarations=[shell])],
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        )

        def ask(contents):
            if not stream:
                return client.models.generate_content(model="gemini-scripted", contents=contents, config=config)
            chunks = list(
                client.models.generate_content_stream(model="gemini-scripted", contents=contents, config=config)
            )
            return chunks

        def converse():
            contents = [types.Content(role="user", parts=[types.Part(text="list files")])]
            first = ask(contents)
            reply = first[-1] if stream else first
            calls = [c for chunk in (first if stream else [first]) for c in (chunk.function_calls or ())]
            response = types.Part(function_response=types.FunctionResponse(id=calls[0].id, name="run_shell",
                                                                           response={"output": "a.txt"}))  # fmt: skip
            contents += [types.Content(role="model", parts=[types.Part(function_call=calls[0])]),
                         types.Content(role="user", parts=[response])]  # fmt: skip
            second = ask(contents)
            answer = "".join(c.text or "" for c in second) if stream else second.text
            return calls, reply, answer

        calls, reply, answer = await trio.to_thread.run_sync(converse)
    (call,) = calls
    assert (call.id, call.name, call.args) == ("c5", "run_shell", {"command": "ls"})
    assert reply.usage_metadata.prompt_token_count == 10 and reply.usage_metadata.candidates_token_count == 5
    assert answer == "Listed."
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    assert [r.path for r in server.requests] == [f"/v1beta/models/gemini-scripted:{method}"] * 2
    assert all(r.headers["x-goog-api-key"] == KEY for r in server.requests)
    roles = [(e["role"], e.get("call")) for e in gateway.record.trajectory]
    assert roles == [("user", None), ("assistant", 1), ("tool", None), ("assistant", 2)]
    assert gateway.record.trajectory[1]["tool_calls"] == [
        {"id": "c5", "name": "run_shell", "arguments": '{"command": "ls"}'}
    ]
    assert gateway.record.usage.to_dict() == {"prompt_tokens": 20, "completion_tokens": 10, "calls": 2, "cost_usd": None}
