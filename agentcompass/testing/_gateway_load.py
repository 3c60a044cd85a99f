"""A measured scenario for the model gateway's memory bound (SPEC 12 "Gateway bounds").

``python -m agentcompass.testing._gateway_load CALLS MIB LIMIT_MIB`` starts,
in this one process, an upstream that reads and drops every body, a
``local`` session, and a gateway whose ``max_body_bytes`` is ``LIMIT_MIB``;
a client process of its own (an agent's place: what it buffers is not the
runtime's) then posts ``CALLS`` chat requests of ``MIB`` MiB each through the
gateway's socket. It prints one JSON line: the statuses, this process's
resident size before the first call, its peak after the third call and
after the last (``VmHWM``), in KiB, and what the gateway recorded.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from typing import Any

import httpx
import trio

from .._asgi import lifespan, listen, serve_asgi

#: This module, for its client process (run as ``__main__`` it has no other name).
_MODULE = "agentcompass.testing._gateway_load"

_REPLY = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    }
).encode()


async def _sink(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An upstream that counts a body's bytes and drops them."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            break
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_REPLY)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _REPLY})


def peak_kib() -> int:
    """This process's peak resident size so far, in KiB: its memory's own
    high-water mark (``VmHWM``; ``ru_maxrss`` would count the parent's image a
    fork left before ``exec``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def resident_kib() -> int:
    """This process's resident size now, in KiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


async def run(calls: int, mib: float, limit_mib: float) -> dict[str, Any]:
    from .. import GatewaySpec, ModelSpec, NetworkPolicy, Secret
    from .._gateway._bounds import attempt_gateway
    from ..environments.local import LocalEnvironment
    from ..gateway import open_gateway
    from ..models import open_model_clients

    size = int(mib * 1024 * 1024)
    spec = GatewaySpec(max_body_bytes=int(limit_mib * 1024 * 1024))
    statuses: list[Any] = []
    with tempfile.TemporaryDirectory() as root:
        async with trio.open_nursery() as nursery, open_model_clients(4):
            listener = listen()
            await nursery.start(serve_asgi, _sink, listener)
            url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
            model = ModelSpec(name="m", api="openai-chat", base_url=url, api_key=Secret("sk-load-scenario-key-0000"))
            env = await LocalEnvironment({"root": root}).open(None, NetworkPolicy("full"), "gw-load")
            try:
                with attempt_gateway("acload0000", spec):
                    async with open_gateway(env, model) as gateway:
                        baseline = resident_kib()
                        early: int | None = None
                        command = [sys.executable, "-m", _MODULE, "--client", gateway.socket_path, gateway.token]
                        proc = await trio.lowlevel.open_process(
                            [*command, str(calls), str(size)], stdout=subprocess.PIPE
                        )
                        assert proc.stdout is not None
                        pending = b""
                        try:
                            while chunk := await proc.stdout.receive_some():
                                *lines, pending = (pending + chunk).split(b"\n")
                                for line in lines:
                                    if line == b"3":  # the client's mark: three calls answered
                                        early = peak_kib()
                                    elif line:
                                        statuses.append(json.loads(line))
                        except BaseException:
                            proc.kill()
                            raise
                        finally:
                            with trio.move_on_after(10, shield=True):
                                await proc.wait()
                        record = gateway.record
            finally:
                await env.close()
            nursery.cancel_scope.cancel()
    return {
        "statuses": statuses,
        "baseline_kib": baseline,
        "peak_kib": peak_kib(),
        "peak_after_3_kib": early,
        "body_bytes": size + len(b'{"model": "m", "messages": [{"role": "user", "content": ""}]}'),
        "recorded_bytes": record.recorded_bytes,
        "cut_bytes": record.cut_bytes,
        "calls": record.calls,
        "issues": [i.code for i in record.issues],
    }


def _client(socket_path: str, token: str, calls: int, size: int) -> None:
    """The agent's side: ``calls`` posts of a ``size``-byte body, a status (or
    the transport error's name) a line, and the line ``3`` after the third."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "%s"}]}' % (b"x" * size)
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    transport = httpx.HTTPTransport(uds=socket_path)
    with httpx.Client(transport=transport, base_url="http://gateway/v1", timeout=120) as client:
        for n in range(calls):
            try:
                status: Any = client.post("/chat/completions", content=body, headers=auth).status_code
            except httpx.TransportError as exc:  # a 413 may cut the upload short
                status = type(exc).__name__
            print(json.dumps(status), flush=True)
            if n == 2:
                print("3", flush=True)


def main(argv: list[str]) -> None:
    if argv[0] == "--client":
        _client(argv[1], argv[2], int(argv[3]), int(argv[4]))
        return
    calls, mib, limit = int(argv[0]), float(argv[1]), float(argv[2])
    print(json.dumps(trio.run(run, calls, mib, limit)))


if __name__ == "__main__":
    main(sys.argv[1:])
