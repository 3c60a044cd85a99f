"""A real model server on 127.0.0.1 (chat completions, Responses, Messages, Gemini), scripted per request.

For tests, demos and benchmarks that need a model without an API key. It is
a plain ASGI app served by hypercorn's Trio worker (HTTP/1.1, keep-alive)
answering four APIs by route (any prefix, any query string):

- ``POST .../chat/completions``: OpenAI chat completions;
- ``POST .../responses``: the OpenAI Responses API (``_responses_render``:
  a ``response`` object whose ``output`` has a ``message`` item and a
  ``function_call`` item per tool call, with its ``call_id``);
- ``POST .../messages``: the Anthropic Messages API (``_messages_render``: a
  ``message`` with ``text`` and ``tool_use`` content blocks; an error is
  Anthropic's error object, 529 ``overloaded_error``);
- ``POST .../models/NAME:generateContent`` and ``:streamGenerateContent``:
  Google's Gemini API (``_gemini_render``: a ``GenerateContentResponse``
  with ``text`` and ``functionCall`` parts; the route, not the body, asks
  for a stream, always answered as server-sent events; an error is
  Google's error object);

``HEAD`` of any path is 200 and is neither recorded nor a step (Claude
Code's probe); every other route is 404. Every request is recorded in
:attr:`ModelServer.requests`. The script is the same for every API: a step
is written once (as a chat completion, which :func:`text` and the rest
build) and rendered in the wire format of the route that asked. What it
answers is a *script*:

- a list of :class:`Reply` values, served in order (past the end: HTTP 500
  ``script exhausted``), or
- a callable ``(RecordedRequest) -> Reply``, such as :func:`episode` (the
  n-th assistant turn of the conversation gets ``steps[n]``, so concurrent
  conversations each follow the script) or :func:`by_instruction` (an episode
  chosen by a substring of a user or tool message, the last one first; a
  message's content may be a string or a list of parts).

Both read the conversation in each API's body as chat-like messages
(``_models._wire``): chat's ``messages``; Responses' ``input`` (a string is
one user message; ``message`` items by role with their ``input_text``
parts, ``function_call_output`` items as tool messages, and each run of
assistant ``message``, ``reasoning`` and ``function_call`` items as *one*
assistant turn; ``instructions`` apart, as a system message); Messages'
``messages`` (``tool_result`` blocks of a user message as tool messages,
its ``text`` blocks as the user message; ``system`` apart); Gemini's
``contents`` (``functionResponse`` parts of a user turn as tool messages, a
``model`` turn as the assistant's; ``systemInstruction`` apart).

``ModelServer(script, fail_after=N)`` answers HTTP 500 (``fail_status``) to
every request after N successful replies: an upstream that breaks mid-episode.
A request body over ``max_body_bytes`` (64 MiB by default) is answered 413.
:meth:`ModelServer.save` writes what it recorded as JSON lines.

Replies: :func:`text`, :func:`tool_call`, :func:`tool_calls` (several calls in
one message), :func:`error` (any status, any headers such as ``Retry-After``
or ``Connection: close``), :func:`malformed` (a 200 whose body is not JSON),
:func:`empty_choices`, :func:`echo_headers` (an error body that repeats the
request's headers, ``Authorization`` and ``x-api-key`` included: a
redaction probe), :func:`stream_error` (a streamed reply that ends in the
API's error event: a chat ``error`` chunk, Responses ``response.failed``,
Messages ``event: error``; HTTP 500 when not streamed);
``reply.after(seconds)`` delays one (a long delay is a server that hangs).
A client that closes its connection while its reply is delayed is counted in
:attr:`ModelServer.aborted`.

In a test::

    server = ModelServer([text("hi")])
    base_url = await nursery.start(server.serve)    # "http://127.0.0.1:PORT/v1"

The server stops when its scope is cancelled, or gracefully after
:meth:`ModelServer.stop`.

As a command::

    python -m agentcompass.testing.model_server [--script FILE] [--port N] [--record FILE] [-- COMMAND ...]

prints the base URL (``http://127.0.0.1:PORT/v1``) and serves until
interrupted; with ``-- COMMAND ...`` it runs the command with
``MODEL_BASE_URL`` set to that URL, then stops and exits with the command's
status (``make demo-agent`` runs ``compass launch`` so). Without
``--script`` every request gets a short text reply. ``--record FILE`` saves
the recorded requests there when it exits.

The script file is JSON::

    {"delay": 0.1,
     "episodes": [{"match": "hello.txt", "steps": [STEP, ...]}, ...],
     "default": [STEP, ...]}

A conversation with a user or tool message containing an episode's
``match`` follows that episode's steps, else ``default`` (with neither: HTTP
400). Its n-th request (n assistant messages since the first message holding
``match``) gets ``steps[n]``; the last step repeats. ``"fail_after": N``
(with ``"fail_status"``, 500) makes every request after N successful replies
fail. A STEP is one of

- ``{"text": "..."}``: an assistant message;
- ``{"tool_call": {"name": "bash", "arguments": {...}}}``: one tool call;
- ``{"tool_calls": [{"name": ..., "arguments": ...}, ...]}``: several;
- ``{"status": 429, "headers": {"Retry-After": "2"}, "body": ...}``: any
  status, headers and JSON body (the API's error object when omitted);
- ``{"malformed": "..."}``: a 200 with that body, not JSON;
- ``{"empty_choices": true}``: a 200 with no message (``"choices": []``;
  Responses ``"output": []``, Messages ``"content": []``);
- ``{"echo_headers": 500}``: that status, the request's headers as body;
- ``{"stream_error": "message"}``: a streamed reply ending in an error event;

each optionally with ``"delay"`` (seconds before the reply; the file's
``delay`` by default), ``"headers"`` (added to the reply's, e.g.
``{"Connection": "close"}`` to close the connection after it),
``"chunk_chars"`` and ``"chunk_delay"`` (streamed replies).

A Responses or Messages request with ``"stream": true`` gets its API's
events (see ``_responses_render`` and ``_messages_render``: text and tool
arguments in pieces of ``Reply.chunk_chars``, usage in the closing events),
as does a Gemini ``:streamGenerateContent`` request (``_gemini_render``).
A chat request with ``"stream": true`` gets a 200 reply whose body has
``choices`` as server-sent events in the chat-completions chunk format:
``data: {chunk}`` events (the role first; the content in pieces of
``Reply.chunk_chars`` characters; each tool call's ``index``, ``id`` and
function name, then its arguments in pieces; a last chunk with the
``finish_reason``), a usage chunk (``"choices": []``) when the request asks
``"stream_options": {"include_usage": true}``, then ``data: [DONE]``;
``Reply.chunk_delay`` spaces the events. Other replies (errors, echoes) are
sent as they are without streaming, and a malformed body is sent as one
event with no ``[DONE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import attrs
import trio

from .._asgi import BodyRefused, lifespan, listen, read_body, serve_asgi
from ._replies import (
    RecordedRequest,
    Reply,
    Script,
    echo_headers,
    empty_choices,
    error,
    malformed,
    stream_error,
    text,
    tool_call,
    tool_calls,
)
from ._scripts import APIS, Api, api_of, by_instruction, episode, load_script, message_text

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
    "message_text",
    "stream_error",
    "text",
    "tool_call",
    "tool_calls",
]


#: The largest request body the server reads, by default (413 past it).
MAX_BODY_BYTES = 64 * 1024 * 1024


class ModelServer:
    """The server (see the module docstring). Start it with ``await nursery.start(server.serve)``.

    A request body over ``max_body_bytes`` is answered 413 in the route's
    API error shape, unread past the limit, and is neither recorded nor a step."""

    def __init__(
        self,
        script: Sequence[Reply] | Script,
        *,
        fail_after: int | None = None,
        fail_status: int = 500,
        max_body_bytes: int = MAX_BODY_BYTES,
    ):
        self._script = script
        self.max_body_bytes = max_body_bytes
        self._next = 0
        #: After this many successful (2xx) replies, every request gets ``fail_status``.
        self.fail_after = fail_after
        self.fail_status = fail_status
        self.good = 0
        self.requests: list[RecordedRequest] = []
        #: Requests whose client closed the connection before the reply was sent.
        self.aborted = 0
        #: Client connections that sent a request (told apart by their address).
        self.connections = 0
        self._peers: set[Any] = set()
        self.base_url = ""
        self._changed = trio.Event()
        self._stop = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[ModelServer], bool]) -> None:
        """Return once ``predicate(server)`` holds (checked after every request
        and abort); the caller bounds the wait."""
        while not predicate(self):
            await self._changed.wait()

    def stop(self) -> None:
        """Stop serving gracefully: no new connections; replies in progress
        get a second to finish. Cancelling :meth:`serve`'s scope stops it at once."""
        self._stop.set()

    def _reply_for(self, request: RecordedRequest) -> Reply:
        if request.method != "POST" or api_of(request.path) is None:
            return error(404, body={"error": {"message": f"no route {request.method} {request.path}"}})
        if self.fail_after is not None and self.good >= self.fail_after:
            return error(self.fail_status)
        reply = self._scripted(request)
        if 200 <= reply.status < 300:
            self.good += 1
        return reply

    def save(self, path: str) -> None:
        """Write the recorded requests to ``path``, one JSON object a line
        (``method``, ``path``, ``headers``, ``body``: the parsed JSON body, or its text)."""
        with open(path, "w", encoding="utf-8") as f:
            for request in self.requests:
                body = request.json
                if body is None:
                    body = request.body.decode("utf-8", errors="replace")
                record = {"method": request.method, "path": request.path, "headers": request.headers, "body": body}
                f.write(json.dumps(record) + "\n")

    def _scripted(self, request: RecordedRequest) -> Reply:
        if callable(self._script):
            return self._script(request)
        if self._next >= len(self._script):
            return error(500, body={"error": {"message": "script exhausted"}})
        self._next += 1
        return self._script[self._next - 1]

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED, port: int = 0) -> None:
        """Listen on 127.0.0.1 (``port`` 0: any free port) and serve until
        cancelled or :meth:`stop`; ``task_status.started`` gets the base URL
        (``http://127.0.0.1:PORT/v1``). A busy port raises ``OSError``."""
        listener = listen(port)
        self.base_url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        with listener:
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(serve_asgi, self._app, listener, stop=self._stop))
                task_status.started(self.base_url)

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI app: record the request, wait out the reply's delay, answer."""
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] == "HEAD":  # a client's connectivity probe (Claude Code's): not a request
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        peer = scope.get("client")
        if peer is None or peer not in self._peers:
            self._peers.add(peer)
            self.connections += 1
        try:
            body = await read_body(receive, self.max_body_bytes)
        except BodyRefused as exc:
            if not exc.left:  # else the client left mid-request
                api = api_of(scope["path"]) or APIS[0]
                payload = json.dumps(api.error(413, str(exc))).encode()
                await send({"type": "http.response.start", "status": 413, "headers": _json_headers(payload)})
                await send({"type": "http.response.body", "body": payload})
            return
        request = _recorded(scope, bytes(body))
        del body
        self.requests.append(request)
        self._notify()
        reply = self._reply_for(request)
        if reply.delay and await _client_left_during(receive, reply.delay):
            self.aborted += 1
            self._notify()
            return
        asked = request.json if isinstance(request.json, dict) else {}
        api = api_of(request.path) or APIS[0]
        if reply.echo_headers and reply.status == 200:
            content = json.dumps(request.headers)
            reply = attrs.evolve(
                text(content), chunk_chars=len(content), piece_bytes=reply.piece_bytes, headers=reply.headers
            )
        if api.streams(request.path, asked) and reply.status == 200 and not reply.echo_headers:
            options = asked.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            if await _stream(send, receive, reply, api, usage):
                self.aborted += 1
                self._notify()
            return
        if reply.stream_error is not None and reply.status == 200:
            reply = error(500, headers=reply.headers)
        if reply.echo_headers:
            payload = json.dumps({"error": {"message": "echo", "headers": request.headers}}).encode()
        elif isinstance(reply.body, bytes):
            payload = reply.body
        elif reply.body is None and reply.status >= 400:
            payload = json.dumps(api.error(reply.status, f"scripted HTTP {reply.status}")).encode()
        elif reply.status == 200 and isinstance(reply.body, dict) and "choices" in reply.body:
            payload = json.dumps(api.body(reply.body)).encode()
        else:
            payload = json.dumps(reply.body).encode()
        headers = _json_headers(payload) + _headers(reply)
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await _send_body(send, payload, reply.piece_bytes, last=True)


async def _send_body(send: Any, data: bytes, piece: int, *, last: bool) -> None:
    """``data`` as one body message, or in ``piece``-byte messages."""
    step = piece or len(data) or 1
    pieces = [data[i : i + step] for i in range(0, len(data), step)] or [b""]
    for n, chunk in enumerate(pieces):
        await send({"type": "http.response.body", "body": chunk, "more_body": not last or n < len(pieces) - 1})


def _json_headers(payload: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]


def _headers(reply: Reply) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]


def _recorded(scope: dict[str, Any], body: bytes) -> RecordedRequest:
    raw = scope.get("raw_path") or scope["path"].encode()
    target = raw.decode("latin-1") + (f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else "")
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    return RecordedRequest(scope["method"], target, headers, body)


async def _client_left_during(receive: Any, seconds: float) -> bool:
    """Wait ``seconds``; True if the client closed the connection meanwhile."""
    with trio.move_on_after(seconds):
        while (await receive())["type"] != "http.disconnect":
            pass
        return True
    return False


async def _stream(send: Any, receive: Any, reply: Reply, api: Api, include_usage: bool) -> bool:
    """Send ``reply`` as ``api``'s server-sent events; True if the client left midway."""
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers + _headers(reply)})
    if isinstance(reply.body, bytes):
        events = [b"data: " + reply.body + b"\n\n"]
    else:
        events = api.events(reply.body, reply.chunk_chars, include_usage, reply.stream_error)
    for n, event in enumerate(events):
        if n and reply.chunk_delay and await _client_left_during(receive, reply.chunk_delay):
            return True
        await _send_body(send, event, reply.piece_bytes, last=n == len(events) - 1)
    return False


async def _main(server: ModelServer, port: int, command: list[str], record: str | None) -> int:
    try:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(server.serve, port=port))
            print(url, flush=True)
            if not command:
                await trio.sleep_forever()
            env = {**os.environ, "MODEL_BASE_URL": url}
            result = await trio.run_process(command, env=env, check=False)
            server.stop()
        return result.returncode
    finally:
        if record:
            server.save(record)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m agentcompass.testing.model_server",
        usage="%(prog)s [--script FILE] [--port N] [--record FILE] [-- COMMAND ...]",
        description=doc.splitlines()[0],
        epilog=doc[doc.index("As a command::") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--script", metavar="FILE", help="JSON script file (default: every request gets a short text reply)"
    )
    parser.add_argument("--port", metavar="N", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--record", metavar="FILE", help="write the recorded requests there (JSON lines) on exit")
    args = parser.parse_args(argv)
    fail_after: int | None = None
    fail_status = 500
    if args.script:
        try:
            with open(args.script, encoding="utf-8") as f:
                data = json.load(f)
            script = load_script(data)
            fail_after = None if data.get("fail_after") is None else int(data["fail_after"])
            fail_status = int(data.get("fail_status", 500))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            print(f"model_server: bad script {args.script}: {exc}", file=sys.stderr)
            return 2
    else:
        script = episode([text("Hello from the scripted model server.")])
    server = ModelServer(script, fail_after=fail_after, fail_status=fail_status)
    try:
        return trio.run(_main, server, args.port, command, args.record)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
