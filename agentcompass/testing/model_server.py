"""A real OpenAI-compatible chat-completions server on 127.0.0.1, scripted per request.

For tests, demos and benchmarks that need a model without an API key. It is
a plain HTTP/1.1 server (Trio sockets and ``h11``, keep-alive) answering
``POST /v1/chat/completions``; every request is recorded in
:attr:`ModelServer.requests`. What it answers is a *script*:

- a list of :class:`Reply` values, served in order (past the end: HTTP 500
  ``script exhausted``), or
- a callable ``(RecordedRequest) -> Reply``, such as :func:`episode` (the
  n-th assistant turn of the conversation gets ``steps[n]``, so concurrent
  conversations each follow the script) or :func:`by_instruction` (an episode
  chosen by a substring of the first user message).

Replies: :func:`text`, :func:`tool_call`, :func:`error` (any status, any
headers such as ``Retry-After``), :func:`malformed` (a 200 whose body is not
JSON), :func:`empty_choices`, :func:`echo_headers` (an error body that
repeats the request's headers, ``Authorization`` included: a redaction
probe); ``reply.after(seconds)`` delays one. A client that closes its
connection while its reply is delayed is counted in :attr:`ModelServer.aborted`.

In a test::

    server = ModelServer([text("hi")])
    base_url = await nursery.start(server.serve)    # "http://127.0.0.1:PORT/v1"

As a command, ``python -m agentcompass.testing.model_server [--script FILE]
[--port N] [-- COMMAND ...]`` prints the base URL and serves until
interrupted; with a command it runs it with ``MODEL_BASE_URL`` set to the
URL, then stops and exits with the command's status. The script file is
JSON: ``{"delay": 0.1, "episodes": [{"match": "hello.txt", "steps": [STEP,
...]}], "default": [STEP, ...]}`` where a STEP is ``{"text": "..."}``,
``{"tool_call": {"name": "bash", "arguments": {...}}}``, ``{"status": 429,
"headers": {...}, "body": ...}``, ``{"malformed": "..."}``,
``{"empty_choices": true}`` or ``{"echo_headers": 500}``, each optionally
with its own ``"delay"``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import h11
import trio

__all__ = [
    "ModelServer",
    "RecordedRequest",
    "Reply",
    "by_instruction",
    "echo_headers",
    "empty_choices",
    "episode",
    "error",
    "load_script",
    "malformed",
    "text",
    "tool_call",
]

_ids = itertools.count(1)


@attrs.frozen
class Reply:
    """One scripted HTTP reply. ``body`` is JSON-encoded unless it is ``bytes``;
    ``echo_headers`` replaces the body with the request's headers."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = attrs.Factory(dict)
    delay: float = 0.0
    echo_headers: bool = False

    def after(self, seconds: float) -> Reply:
        """This reply, sent ``seconds`` after the request arrived."""
        return attrs.evolve(self, delay=seconds)


@attrs.frozen
class RecordedRequest:
    """A request as the server received it (header names lower-case)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def _completion(message: dict[str, Any], finish: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def text(content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5) -> Reply:
    """An assistant message with ``content`` and no tool call."""
    message = {"role": "assistant", "content": content}
    return Reply(body=_completion(message, "stop", prompt_tokens, completion_tokens))


def tool_call(
    name: str,
    arguments: dict[str, Any] | str,
    *,
    call_id: str | None = None,
    content: str | None = None,
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
) -> Reply:
    """An assistant message calling tool ``name`` with ``arguments`` (a dict is JSON-encoded)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call = {"id": call_id or f"call_{next(_ids)}", "type": "function", "function": {"name": name, "arguments": args}}
    message = {"role": "assistant", "content": content, "tool_calls": [call]}
    return Reply(body=_completion(message, "tool_calls", prompt_tokens, completion_tokens))


def error(status: int, *, headers: dict[str, str] | None = None, body: Any = None) -> Reply:
    """An HTTP error reply (``body`` defaults to an OpenAI-style error object)."""
    if body is None:
        body = {"error": {"message": f"scripted HTTP {status}", "type": "scripted", "code": status}}
    return Reply(status=status, body=body, headers=dict(headers or {}))


def malformed(body: str = '{"choices": [') -> Reply:
    """A 200 reply whose body is not valid JSON."""
    return Reply(body=body.encode())


def empty_choices() -> Reply:
    """A 200 reply with ``"choices": []``."""
    return Reply(body={"id": "chatcmpl-empty", "object": "chat.completion", "choices": [], "usage": {}})


def echo_headers(status: int = 500) -> Reply:
    """An error reply whose body repeats every request header, ``Authorization`` included."""
    return Reply(status=status, echo_headers=True)


Script = Callable[[RecordedRequest], Reply]


def episode(steps: Sequence[Reply], *, delay: float = 0.0) -> Script:
    """Reply ``steps[n]`` to a request whose conversation has ``n`` assistant
    messages (the last step repeats), each after ``delay`` unless it has its own."""
    replies = [s if s.delay or not delay else s.after(delay) for s in steps]

    def reply(request: RecordedRequest) -> Reply:
        body = request.json
        messages = body.get("messages", []) if isinstance(body, dict) else []
        turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        return replies[min(turn, len(replies) - 1)]

    return reply


def by_instruction(episodes: Sequence[tuple[str, Script]], default: Script | None = None) -> Script:
    """The script of the first ``(substring, script)`` whose substring is in the
    conversation's first user message; else ``default`` (else HTTP 400)."""

    def reply(request: RecordedRequest) -> Reply:
        body = request.json
        messages = body.get("messages", []) if isinstance(body, dict) else []
        first = next((m.get("content") or "" for m in messages if isinstance(m, dict) and m.get("role") == "user"), "")
        for needle, script in episodes:
            if needle in first:
                return script(request)
        if default is not None:
            return default(request)
        return error(400, body={"error": {"message": "no scripted episode matches this conversation"}})

    return reply


class ModelServer:
    """The server (see the module docstring). Start it with ``await nursery.start(server.serve)``."""

    def __init__(self, script: Sequence[Reply] | Script):
        self._script = script
        self._next = 0
        self.requests: list[RecordedRequest] = []
        #: Requests whose client closed the connection before the reply was sent.
        self.aborted = 0
        #: Connections accepted and connections that have ended.
        self.connections = 0
        self.closed_connections = 0
        self.base_url = ""
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[ModelServer], bool]) -> None:
        """Return once ``predicate(server)`` holds (checked after every request
        and connection event); the caller bounds the wait."""
        while not predicate(self):
            await self._changed.wait()

    def _reply_for(self, request: RecordedRequest) -> Reply:
        if request.method != "POST" or not request.path.rstrip("/").endswith("/chat/completions"):
            return error(404, body={"error": {"message": f"no route {request.method} {request.path}"}})
        if callable(self._script):
            return self._script(request)
        if self._next >= len(self._script):
            return error(500, body={"error": {"message": "script exhausted"}})
        self._next += 1
        return self._script[self._next - 1]

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED, port: int = 0) -> None:
        """Listen on 127.0.0.1 (``port`` 0: any free port) and serve until cancelled;
        ``task_status.started`` gets the base URL (``http://127.0.0.1:PORT/v1``)."""
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        bound = listeners[0].socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{bound}/v1"
        async with trio.open_nursery() as nursery:
            task_status.started(self.base_url)
            await trio.serve_listeners(self._connection, listeners, handler_nursery=nursery)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read_request(conn, stream)
                if request is None:
                    return
                self.requests.append(request)
                self._notify()
                reply = self._reply_for(request)
                if reply.delay and await self._client_left_during(stream, reply.delay):
                    self.aborted += 1
                    self._notify()
                    return
                await self._send(conn, stream, request, reply)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            self.closed_connections += 1
            self._notify()

    async def _read_request(self, conn: h11.Connection, stream: trio.SocketStream) -> RecordedRequest | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                if not data and conn.their_state is h11.IDLE:
                    return None
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                headers = {k.decode().lower(): v.decode("latin-1") for k, v in head.headers}
                return RecordedRequest(head.method.decode(), head.target.decode(), headers, bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _client_left_during(self, stream: trio.SocketStream, delay: float) -> bool:
        """Wait ``delay``; True if the client closed the connection meanwhile."""
        with trio.move_on_after(delay):
            data = await stream.receive_some(65536)
            if not data:
                return True
            # A pipelined request would arrive here; no OpenAI client pipelines.
            raise h11.ProtocolError("unexpected data while a reply is pending")
        return False

    async def _send(
        self, conn: h11.Connection, stream: trio.SocketStream, request: RecordedRequest, reply: Reply
    ) -> None:
        if reply.echo_headers:
            payload = json.dumps({"error": {"message": "echo", "headers": request.headers}}).encode()
        elif isinstance(reply.body, bytes):
            payload = reply.body
        else:
            payload = json.dumps(reply.body).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]
        headers += [(k, v) for k, v in reply.headers.items()]
        data = conn.send(h11.Response(status_code=reply.status, headers=headers))
        data += conn.send(h11.Data(data=payload))
        data += conn.send(h11.EndOfMessage())
        await stream.send_all(data)


def _step(raw: dict[str, Any], delay: float) -> Reply:
    if not isinstance(raw, dict):
        raise ValueError(f"a script step must be an object, got {raw!r}")
    raw = dict(raw)
    step_delay = float(raw.pop("delay", delay))
    if "text" in raw:
        reply = text(str(raw["text"]))
    elif "tool_call" in raw:
        call = raw["tool_call"]
        reply = tool_call(call["name"], call.get("arguments", {}))
    elif "status" in raw:
        reply = error(int(raw["status"]), headers=raw.get("headers"), body=raw.get("body"))
    elif "malformed" in raw:
        reply = malformed(str(raw["malformed"]))
    elif "empty_choices" in raw:
        reply = empty_choices()
    elif "echo_headers" in raw:
        reply = echo_headers(int(raw["echo_headers"]))
    else:
        raise ValueError(f"unknown script step {sorted(raw)}")
    return reply.after(step_delay) if step_delay else reply


def load_script(data: dict[str, Any]) -> Script:
    """The script a JSON script file describes (see the module docstring)."""
    delay = float(data.get("delay", 0))
    episodes = [(e["match"], episode([_step(s, delay) for s in e["steps"]])) for e in data.get("episodes", [])]
    default = episode([_step(s, delay) for s in data["default"]]) if data.get("default") else None
    return by_instruction(episodes, default)


async def _main(script: Script, port: int, command: list[str]) -> int:
    server = ModelServer(script)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial_serve(server, port))
        print(url, flush=True)
        if not command:
            await trio.sleep_forever()
        env = {**os.environ, "MODEL_BASE_URL": url}
        result = await trio.run_process(command, env=env, check=False)
        nursery.cancel_scope.cancel()
    return result.returncode


def partial_serve(server: ModelServer, port: int) -> Callable[..., Any]:
    async def serve(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await server.serve(task_status=task_status, port=port)

    return serve


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m agentcompass.testing.model_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--script", help="JSON script file (default: every request gets a short text reply)")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args(argv)
    if args.script:
        try:
            with open(args.script, encoding="utf-8") as f:
                script = load_script(json.load(f))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"model_server: bad script {args.script}: {exc}", file=sys.stderr)
            return 2
    else:
        script = episode([text("Hello from the scripted model server.")])
    try:
        return trio.run(_main, script, args.port, command)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
