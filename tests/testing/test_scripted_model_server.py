"""The scripted model server on hypercorn: its scripted behaviours over real
loopback HTTP, streamed replies (server-sent events, tool calls, usage), its
life in the caller's scope, and its command form."""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import attrs
import httpx
import pytest
import trio
from _common import serving

from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import (
    ModelServer,
    RecordedRequest,
    echo_headers,
    empty_choices,
    error,
    load_script,
    malformed,
    text,
    tool_call,
    tool_calls,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def refused(base_url: str) -> bool:
    port = int(base_url.split(":")[2].split("/")[0])
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


async def sse(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of a server-sent event stream, ``[DONE]`` as a string."""
    assert response.headers["content-type"] == "text/event-stream"
    events, lines = [], []
    async for line in response.aiter_lines():
        if line:
            lines.append(line)
            continue
        (data,) = lines  # one data line per event, as OpenAI sends them
        assert data.startswith("data: ")
        payload = data[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
        lines = []
    assert lines == []
    return events


async def test_scripted_statuses_headers_and_bodies_as_before():
    script = [
        text("hello", prompt_tokens=11, completion_tokens=3),
        tool_call("bash", {"command": "ls"}, call_id="c1"),
        error(429, headers={"Retry-After": "7"}),
        malformed("{nope"),
        empty_choices(),
        echo_headers(502),
    ]
    async with hang_guard(20), serving(script) as server, httpx.AsyncClient() as http:
        url = server.base_url + "/chat/completions"
        replies = [await http.post(url, json={"messages": MESSAGES}, headers={"Authorization": "Bearer sk-x"}) for _ in range(7)]
        missing = await http.get(server.base_url + "/models?x=1")
    first, second, limited, bad, empty, echoed, exhausted = replies
    assert first.json()["choices"][0]["message"]["content"] == "hello"
    assert first.json()["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    (call,) = second.json()["choices"][0]["message"]["tool_calls"]
    assert call == {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    assert second.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert (limited.status_code, limited.headers["retry-after"]) == (429, "7")
    assert limited.json()["error"]["code"] == 429
    assert (bad.status_code, bad.content) == (200, b"{nope")
    assert empty.json()["choices"] == []
    assert echoed.status_code == 502 and echoed.json()["error"]["headers"]["authorization"] == "Bearer sk-x"
    assert exhausted.status_code == 500 and "exhausted" in exhausted.text
    assert missing.status_code == 404
    assert [(r.method, r.path) for r in server.requests][-2:] == [("POST", "/v1/chat/completions"), ("GET", "/v1/models?x=1")]
    assert server.requests[0].json == {"messages": MESSAGES}
    assert server.requests[0].headers["authorization"] == "Bearer sk-x"
    assert server.connections == 1  # every request on one keep-alive connection


async def test_a_delayed_reply_waits_and_a_client_that_leaves_is_counted_aborted():
    script = [text("late").after(0.3), text("never").after(3600), text("after")]
    async with hang_guard(20), serving(script) as server, httpx.AsyncClient() as http:
        url = server.base_url + "/chat/completions"
        start = trio.current_time()
        assert (await http.post(url, json={})).json()["choices"][0]["message"]["content"] == "late"
        assert trio.current_time() - start >= 0.3
        with pytest.raises(httpx.ReadTimeout):  # a hanging server, given up on
            await http.post(url, json={}, timeout=httpx.Timeout(5, read=0.2))
        await server.wait_until(lambda s: s.aborted == 1)
        assert (await http.post(url, json={})).json()["choices"][0]["message"]["content"] == "after"
    assert server.connections == 2  # the abandoned connection is not reused


async def test_a_connection_close_reply_closes_the_connection():
    script = [attrs.evolve(text("a"), headers={"Connection": "close"}), text("b")]
    async with hang_guard(20), serving(script) as server, httpx.AsyncClient() as http:
        url = server.base_url + "/chat/completions"
        first = await http.post(url, json={})
        second = await http.post(url, json={})
    assert first.headers["connection"] == "close" and second.status_code == 200
    assert server.connections == 2


async def test_a_streamed_reply_with_tool_calls_in_openai_chunks():
    reply = tool_calls(
        [("bash", {"command": "ls -la /app"}, "call_a"), ("submit", {"answer": "done"}, "call_b")],
        content="Let me look.",
        prompt_tokens=21,
        completion_tokens=8,
    )
    async with hang_guard(20), serving([reply, reply]) as server, httpx.AsyncClient() as http:
        url = server.base_url + "/chat/completions"
        async with http.stream("POST", url, json={"messages": MESSAGES, "stream": True}) as response:
            assert response.status_code == 200
            events = await sse(response)
        # The same reply to a request that does not stream: one JSON body.
        whole = (await http.post(url, json={"messages": MESSAGES})).json()
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert all("usage" not in c for c in chunks)  # not asked for
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content") or "" for d in deltas) == "Let me look."
    assert sum(1 for d in deltas if d.get("content")) > 1  # the text comes in pieces
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]
    # Reassemble the calls as a client must: by index; id and name come first, the arguments in pieces.
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for part in delta.get("tool_calls", []):
            call = calls.setdefault(part["index"], {"id": None, "name": None, "arguments": "", "pieces": 0})
            if "id" in part:
                assert call["id"] is None and part["type"] == "function"
                call["id"], call["name"] = part["id"], part["function"]["name"]
            else:
                assert call["id"] is not None and set(part) == {"index", "function"}
                call["pieces"] += 1
            call["arguments"] += part["function"]["arguments"]
    assert [(i, c["id"], c["name"], json.loads(c["arguments"])) for i, c in sorted(calls.items())] == [
        (0, "call_a", "bash", {"command": "ls -la /app"}),
        (1, "call_b", "submit", {"answer": "done"}),
    ]
    assert all(c["pieces"] > 1 for c in calls.values())  # arguments split across chunks
    message = whole["choices"][0]["message"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        (calls[n]["id"], calls[n]["name"], calls[n]["arguments"]) for n in (0, 1)
    ]


async def test_include_usage_adds_a_last_usage_chunk():
    script = [text("A streamed answer.", prompt_tokens=9, completion_tokens=4), text("again")]
    async with hang_guard(20), serving(script) as server, httpx.AsyncClient() as http:
        url = server.base_url + "/chat/completions"
        body = {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
        async with http.stream("POST", url, json=body) as response:
            events = await sse(response)
        async with http.stream("POST", url, json={**body, "stream_options": {"include_usage": False}}) as response:
            without = await sse(response)
    *chunks, last, done = events
    assert done == "[DONE]"
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    assert all(c["usage"] is None for c in chunks)  # null on every other chunk, as OpenAI sends it
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "A streamed answer."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert without[-1] == "[DONE]" and all("usage" not in c for c in without[:-1]) and without[-2]["choices"]


async def test_a_streamed_request_still_gets_scripted_errors_and_malformed_events():
    script = [error(503), malformed("{broken"), attrs.evolve(text("abcdef"), chunk_chars=2, chunk_delay=0.05)]
    async with hang_guard(20), serving(script) as server, httpx.AsyncClient() as http:
        url = server.base_url + "/chat/completions"
        body = {"messages": MESSAGES, "stream": True}
        failed = await http.post(url, json=body)
        async with http.stream("POST", url, json=body) as response:
            raw = (await response.aread()).decode()
        start = trio.current_time()
        async with http.stream("POST", url, json=body) as response:
            events = await sse(response)
    assert failed.status_code == 503 and failed.json()["error"]["code"] == 503
    assert raw == "data: {broken\n\n"  # no [DONE]: the stream is broken
    assert [c["choices"][0]["delta"].get("content") for c in events[1:-2]] == ["ab", "cd", "ef"]
    assert trio.current_time() - start >= 0.05 * (len(events) - 1)


def test_a_script_file_shapes_every_step():
    script = load_script(
        {
            "default": [
                {"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b"}], "chunk_chars": 3},
                {"text": "bye", "headers": {"Connection": "close"}, "chunk_delay": 0.5, "delay": 1},
            ]
        }
    )
    def ask(turns: int):
        messages = MESSAGES + [{"role": "assistant", "content": "x"}] * turns
        return script(RecordedRequest("POST", "/v1/chat/completions", {}, json.dumps({"messages": messages}).encode()))

    calls, bye = ask(0), ask(1)
    names = [c["function"]["name"] for c in calls.body["choices"][0]["message"]["tool_calls"]]
    assert (names, calls.chunk_chars) == (["a", "b"], 3)
    assert (bye.headers, bye.chunk_delay, bye.delay) == ({"Connection": "close"}, 0.5, 1.0)


async def test_the_server_lives_in_the_callers_scope():
    server = ModelServer([text("a")])
    async with hang_guard(20):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve)
                async with httpx.AsyncClient() as http:
                    await http.post(server.base_url + "/chat/completions", json={})
                    scope.cancel()  # the client's keep-alive connection is still open
        assert refused(server.base_url)
        # stop(): a graceful end, idle keep-alive connections closed.
        stopped = ModelServer([text("b")])
        async with trio.open_nursery() as nursery:
            await nursery.start(stopped.serve)
            async with httpx.AsyncClient() as http:
                await http.post(stopped.base_url + "/chat/completions", json={})
                stopped.stop()
        assert refused(stopped.base_url)


async def test_a_busy_port_is_one_oserror():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        async with hang_guard(20), trio.open_nursery() as nursery:
            with pytest.raises(OSError):
                await nursery.start(lambda task_status: ModelServer([]).serve(task_status=task_status, port=port))


async def test_the_command_form_runs_the_command_and_exits_with_its_status(tmp_path):
    (tmp_path / "script.json").write_text(json.dumps({"default": [{"text": "from the script"}]}))
    probe = (
        "import os, sys, httpx\n"
        "r = httpx.post(os.environ['MODEL_BASE_URL'] + '/chat/completions', json={'messages': []})\n"
        "sys.exit(7 if r.json()['choices'][0]['message']['content'] == 'from the script' else 1)\n"
    )
    server = [sys.executable, "-m", "agentcompass.testing.model_server"]
    with hang_guard(60):
        done = await trio.run_process(
            [*server, "--script", str(tmp_path / "script.json"), "--", sys.executable, "-c", probe],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
        bad = await trio.run_process([*server, "--script", str(tmp_path / "nope.json")], capture_stderr=True, check=False)
        helped = await trio.run_process([*server, "--help"], capture_stdout=True, check=False)
    assert done.returncode == 7, done.stderr.decode()
    assert done.stdout.decode().startswith("http://127.0.0.1:") and done.stdout.decode().strip().endswith("/v1")
    assert done.stderr == b""  # hypercorn's start-up lines stay out
    assert bad.returncode == 2 and b"bad script" in bad.stderr
    usage = helped.stdout.decode()
    for documented in ("-- COMMAND", "MODEL_BASE_URL", '"episodes"', '"tool_calls"', '"echo_headers"', "include_usage", "[DONE]"):
        assert documented in usage, documented
