"""The scripted model server's Responses and Messages routes: the same script
steps rendered in each API's wire format (complete and streamed, with tool
calls), the conversation found in each API's body for ``episode`` and
``by_instruction``, errors in each API's shape, and ``HEAD /``."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import (
    ModelServer,
    RecordedRequest,
    episode,
    error,
    load_script,
    stream_error,
    text,
    tool_call,
    tool_calls,
)


async def exchange(script, requests):
    """POST each ``(path, body)`` to a server with ``script``; the replies and the server."""
    server = ModelServer(script)
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        origin = url.removesuffix("/v1")
        async with httpx.AsyncClient(base_url=origin) as client:
            replies = [await client.post(path, json=body) for path, body in requests]
        nursery.cancel_scope.cancel()
    return replies, server


def events(reply: httpx.Response) -> list[tuple[str, dict]]:
    """``(event name, data)`` of each server-sent event."""
    out = []
    for block in reply.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if line)
        if lines:
            out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


async def test_a_tool_call_as_a_responses_object_and_as_a_message():
    step = tool_calls([("shell", {"command": "ls"}, "call_1"), ("shell", '{"command": "pwd"}', "call_2")],
                      content="Looking.", prompt_tokens=9, completion_tokens=4)  # fmt: skip
    (responses, messages), server = await exchange(
        [step, step], [("/v1/responses", {"input": "hi"}), ("/v1/messages?beta=true", {"messages": []})]
    )
    body = responses.json()
    assert body["object"] == "response" and body["status"] == "completed"
    message, first, second = body["output"]
    assert message["type"] == "message" and message["content"][0] == {
        "type": "output_text", "text": "Looking.", "annotations": [], "logprobs": [],
    }  # fmt: skip
    assert (first["type"], first["call_id"], first["name"]) == ("function_call", "call_1", "shell")
    assert json.loads(second["arguments"]) == {"command": "pwd"} and first["id"] != second["id"]
    assert body["usage"]["input_tokens"] == 9 and body["usage"]["output_tokens"] == 4
    reply = messages.json()
    assert {k: reply[k] for k in ("type", "role", "stop_reason", "stop_sequence")} == {
        "type": "message", "role": "assistant", "stop_reason": "tool_use", "stop_sequence": None,
    }  # fmt: skip
    assert reply["content"] == [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "call_1", "name": "shell", "input": {"command": "ls"}},
        {"type": "tool_use", "id": "call_2", "name": "shell", "input": {"command": "pwd"}},
    ]
    assert reply["usage"]["input_tokens"] == 9 and reply["usage"]["output_tokens"] == 4
    assert [r.path for r in server.requests] == ["/v1/responses", "/v1/messages?beta=true"]


async def test_a_streamed_responses_reply_carries_the_fields_clients_parse():
    step = tool_call("shell", {"command": "ls -la"}, call_id="call_9", content="Hi there, listing")
    (reply,), _ = await exchange([step], [("/v1/responses", {"input": "hi", "stream": True})])
    assert reply.headers["content-type"].startswith("text/event-stream")
    stream = events(reply)
    assert all(name == data["type"] for name, data in stream)
    assert [data["sequence_number"] for _, data in stream] == list(range(len(stream)))
    kinds = [name for name, _ in stream]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
    text_deltas = [d for n, d in stream if n == "response.output_text.delta"]
    assert "".join(d["delta"] for d in text_deltas) == "Hi there, listing" and len(text_deltas) > 1
    assert all({"item_id", "output_index", "content_index"} <= set(d) for d in text_deltas)
    argument_deltas = [d for n, d in stream if n == "response.function_call_arguments.delta"]
    assert json.loads("".join(d["delta"] for d in argument_deltas)) == {"command": "ls -la"}
    assert {d["output_index"] for d in argument_deltas} == {1}
    added = next(d["item"] for n, d in stream if n == "response.output_item.added" and d["output_index"] == 1)
    assert (added["type"], added["call_id"], added["arguments"]) == ("function_call", "call_9", "")
    final = stream[-1][1]["response"]
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 15
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]


async def test_a_streamed_message_follows_anthropics_event_order():
    step = tool_call("Bash", {"command": "ls"}, call_id="toolu_3", content="Sure.", prompt_tokens=21, completion_tokens=8)
    (reply,), _ = await exchange([step], [("/v1/messages", {"messages": [], "stream": True})])
    stream = events(reply)
    assert [name for name, _ in stream] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", *["content_block_delta"] * (len(stream) - 9), "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    message = stream[0][1]["message"]
    assert {"id", "type", "role", "content", "model", "stop_reason", "usage"} <= set(message)
    assert message["content"] == [] and message["stop_reason"] is None and message["usage"]["input_tokens"] == 21
    assert stream[2][1]["content_block"] == {"type": "text", "text": ""}
    assert stream[5][1]["content_block"] == {"type": "tool_use", "id": "toolu_3", "name": "Bash", "input": {}}
    pieces = [d["delta"] for n, d in stream if n == "content_block_delta" and d["index"] == 1]
    assert {p["type"] for p in pieces} == {"input_json_delta"}
    assert json.loads("".join(p["partial_json"] for p in pieces)) == {"command": "ls"}
    assert stream[-2][1]["delta"]["stop_reason"] == "tool_use" and stream[-2][1]["usage"] == {"output_tokens": 8}


async def test_errors_and_broken_streams_take_each_apis_shape():
    script = [error(529), error(429, headers={"Retry-After": "4"}), stream_error("went away"), stream_error("gone")]
    replies, _ = await exchange(
        script,
        [
            ("/v1/messages", {"messages": []}),
            ("/v1/responses", {"input": "x"}),
            ("/v1/messages", {"messages": [], "stream": True}),
            ("/v1/responses", {"input": "x", "stream": True}),
        ],
    )
    overloaded, limited, broken_message, broken_response = replies
    assert overloaded.status_code == 529
    assert overloaded.json() == {"type": "error", "error": {"type": "overloaded_error", "message": "scripted HTTP 529"}}
    assert limited.status_code == 429 and limited.headers["retry-after"] == "4"
    assert limited.json()["error"]["message"] == "scripted HTTP 429"
    last_name, last = events(broken_message)[-1]
    assert (last_name, last["error"]["type"], last["error"]["message"]) == ("error", "overloaded_error", "went away")
    assert "message_stop" not in broken_message.text
    name, failed = events(broken_response)[-1]
    assert name == "response.failed" and failed["response"]["error"]["message"] == "gone"
    assert "response.completed" not in broken_response.text


async def test_head_is_answered_and_not_recorded():
    server = ModelServer([text("only")])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with httpx.AsyncClient() as client:
            probe = await client.head(url.removesuffix("/v1") + "/")
            after = await client.post(url + "/messages", json={"messages": []})
        nursery.cancel_scope.cancel()
    assert probe.status_code == 200
    assert after.json()["content"] == [{"type": "text", "text": "only"}]  # the probe took no step
    assert [r.method for r in server.requests] == ["POST"]


def _request(path: str, body: dict) -> RecordedRequest:
    return RecordedRequest("POST", path, {}, json.dumps(body).encode())


def test_responses_turns_count_one_per_assistant_reply():
    script = episode([text("0"), text("1"), text("2"), text("3")])

    def content(body):
        return script(_request("/v1/responses", body)).body["choices"][0]["message"]["content"]

    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "task"}]}
    calls = [
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running."}]},
        {"type": "function_call", "call_id": "a", "name": "shell", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "shell", "arguments": "{}"},
    ]
    outputs = [{"type": "function_call_output", "call_id": c, "output": "ok"} for c in ("a", "b")]
    assert content({"input": "task"}) == "0"
    assert content({"instructions": "be good", "input": [user]}) == "0"
    assert content({"input": [user, *calls, *outputs]}) == "1"  # four items, one reply
    assert content({"input": [user, *calls, *outputs, *calls[2:], *outputs]}) == "2"


def test_messages_turns_and_tool_results_are_found():
    script = episode([text("0"), text("1"), text("2")])

    def content(body):
        return script(_request("/v1/messages", body)).body["choices"][0]["message"]["content"]

    tool_use = {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                                 {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]}  # fmt: skip
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "out"}]}
    assert content({"system": "sys", "messages": [{"role": "user", "content": "go"}]}) == "0"
    assert content({"messages": [{"role": "user", "content": "go"}, tool_use, result]}) == "1"


def test_a_script_file_finds_its_episode_in_every_apis_body():
    script = load_script(
        {
            "episodes": [
                {"match": "hello.txt", "steps": [{"tool_call": {"name": "bash", "arguments": {"command": "cat hello.txt"}}},
                                                 {"text": "done"}]},  # fmt: skip
                {"match": "OUTPUT-42", "steps": [{"status": 529}]},
            ],
            "default": [{"text": "unknown task"}],
        }
    )
    bodies = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "Make hello.txt"}]},
        "/v1/responses": {
            "instructions": "You are Codex.",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Make hello.txt"}]}],
        },
        "/v1/messages": {"system": [{"type": "text", "text": "You are Claude."}],
                         "messages": [{"role": "user", "content": [{"type": "text", "text": "Make hello.txt"}]}]},
    }  # fmt: skip
    for path, body in bodies.items():
        reply = script(_request(path, body))
        assert reply.body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash", path
    # A tool's result names the second episode's needle: its last message wins.
    codex = {"input": [*bodies["/v1/responses"]["input"],
                       {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"},
                       {"type": "function_call_output", "call_id": "c", "output": "OUTPUT-42"}]}  # fmt: skip
    claude = {"messages": [*bodies["/v1/messages"]["messages"],
                           {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                         "content": [{"type": "text", "text": "OUTPUT-42"}]}]}]}  # fmt: skip
    assert script(_request("/v1/responses", codex)).status == 529
    assert script(_request("/v1/messages", claude)).status == 529
    assert script(_request("/v1/messages", {"messages": [{"role": "user", "content": "?"}]})).body["choices"][0][
        "message"
    ]["content"] == "unknown task"


def test_a_stream_error_step_loads_from_a_script_file():
    script = load_script({"default": [{"stream_error": "overloaded"}]})
    reply = script(_request("/v1/messages", {"messages": []}))
    assert reply.stream_error == "overloaded"
    with pytest.raises(ValueError, match="unknown script step"):
        load_script({"default": [{"stream_eror": "x"}]})
