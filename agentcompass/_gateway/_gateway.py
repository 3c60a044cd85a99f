"""The model gateway of one attempt (SPEC 10 "Model gateway").

:func:`open_gateway` serves, for the body of an ``async with``, an
OpenAI-compatible endpoint that an agent running inside the attempt's
session uses instead of the real model, in the model's own API (chat
completions, Responses, Messages or Gemini): it checks the attempt's own token,
forwards each call through the orchestration's shared model client (the
real key is that client's header and never leaves the runtime), records it
into a :class:`GatewayRecord` and classifies its failures as the model
client does.

Where it listens: a unix socket, alone in a fresh directory of the host's
temporary directory (``agentcompass-gateway-<run tag>-*``, so that
``compass reap`` and a ``--reuse`` run remove what a killed run left: see
:func:`remove_gateway_dirs`), exposed into the session with
:meth:`EnvironmentSession.expose_socket`. A unix socket needs no network
interface, so a session under run policy ``none`` reaches the gateway and
nothing else, and no TCP port is open anywhere: the endpoint is reachable
from that session (and the host's root) only. Inside, a small forwarder
(``_forwarder.py``, run on the session's ``python3``) relays
``127.0.0.1:PORT`` to the socket, since agents speak HTTP over TCP;
:meth:`Gateway.command` wraps an agent's command line with it.

One server per attempt: the token, the socket and the directory die when
the ``async with`` ends (a call in flight is cut off), so nothing an agent
kept can reach the model afterwards.

The app is ``_app``'s; this module owns the lifetime.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import trio

from .._asgi import serve_asgi
from .._models import model_client
from .._models._budget import Meter, current_meter
from ..runtime._cleanup import cleanup_deadline
from ..runtime._components import EnvironmentSession
from ..runtime._errors import IssueError
from ..runtime._values import Limits, ModelSpec
from ._app import GatewayApp
from ._bounds import current_gateway
from ._record import GatewayRecord

__all__ = ["Gateway", "open_gateway", "remove_gateway_dirs"]

#: The prefix of every gateway directory in the host's temporary directory.
DIR_PREFIX = "agentcompass-gateway-"
_TAG = re.compile(r"[a-z0-9]{4,40}")

_FORWARDER = Path(__file__).with_name("_forwarder.py")
#: The variables :meth:`Gateway.command` sets for the wrapped command.
URL_VARIABLE = "AGENTCOMPASS_GATEWAY_URL"
TOKEN_VARIABLE = "AGENTCOMPASS_GATEWAY_TOKEN"


@attrs.define(eq=False)
class Gateway:
    """One attempt's gateway, valid inside :func:`open_gateway`'s block.

    ``token`` is what the agent sends as its API key (``Authorization:
    Bearer`` or ``x-api-key``); ``socket_path`` and ``forwarder`` are paths
    inside the session; ``record`` fills as calls go through; ``model`` is
    the name the agent should ask for (the request model's) and ``api`` its
    API (``openai-chat``, ``openai-responses``, ``anthropic-messages``,
    ``google-generate-content``), which decides the route served:
    ``/v1/chat/completions`` (and ``/v1/models``), ``/v1/responses``,
    ``/v1/messages`` or ``/v1beta/models/NAME:generateContent`` (and
    ``:streamGenerateContent``).
    """

    token: str
    model: str
    socket_path: str
    forwarder: str
    record: GatewayRecord
    api: str = "openai-chat"

    def command(self, cmd: str) -> str:
        """A ``bash`` script that starts the forwarder, exports
        ``AGENTCOMPASS_GATEWAY_URL`` (``http://127.0.0.1:PORT/v1``) and
        ``AGENTCOMPASS_GATEWAY_TOKEN``, runs ``cmd`` (shell text) and exits
        with its status, stopping the forwarder. Exit status 97: the
        forwarder could not start (no ``python3`` in the session)."""
        return (
            f"read -r _gw_port _gw_pid < <(python3 {shlex.quote(self.forwarder)} {shlex.quote(self.socket_path)})"
            " || exit 97\n"
            '[ -n "$_gw_port" ] || exit 97\n'
            'trap \'kill "$_gw_pid" 2>/dev/null\' EXIT\n'
            f'export {URL_VARIABLE}="http://127.0.0.1:$_gw_port/v1" {TOKEN_VARIABLE}={shlex.quote(self.token)}\n'
            f"{cmd}\n"
        )


@asynccontextmanager
async def open_gateway(
    env: EnvironmentSession, model: ModelSpec, *, max_model_calls: int | None = None
) -> AsyncIterator[Gateway]:
    """Serve a gateway to ``model`` for the session ``env`` during the block.

    ``model``'s ``api`` decides what is served: ``openai-chat``
    ``/v1/chat/completions`` (and ``/v1/models``), ``openai-responses``
    ``/v1/responses``, ``anthropic-messages`` ``/v1/messages``,
    ``google-generate-content`` ``/v1beta/models/NAME:generateContent`` and
    ``:streamGenerateContent`` (any prefix before the route; Anthropic's SDKs append ``/v1/messages`` to their base
    URL, so give them the URL without ``/v1``). The calls go through the
    orchestration's shared client for it
    (:func:`agentcompass.models.model_client`), so this needs a running
    orchestration or ``open_model_clients``; ``api: none`` is FATAL
    ``setup_failed``. The run's budgets (``ExecutionSpec.limits``, tightened
    by ``max_model_calls``, an alias of ``limits.model_calls``) hold for
    the calls through it: once one is used up, each further call is answered
    HTTP 429 with an error body in the API's shape (never forwarded) and
    the record gets ERROR ``harness_limit_reached`` naming the limit.
    Raises FATAL ``environment_unsupported`` when the session's provider
    cannot expose a socket. On the way out the server stops at once.

    Inside a run, the request's ``execution.gateway`` bounds what an agent
    may send and what is recorded (:class:`agentcompass.GatewaySpec`).
    """
    if model.api == "none":
        raise IssueError("fatal", "setup_failed", "the model gateway needs a model with an api, not 'none'")
    client = model_client(model)
    tag, spec = current_gateway()
    prefix = DIR_PREFIX + (f"{tag}-" if tag is not None and _TAG.fullmatch(tag) else "")
    directory = await trio.to_thread.run_sync(partial(tempfile.mkdtemp, prefix=prefix))
    try:
        # Traversable, not listable: the session's user must reach the socket
        # in it; the directory's random name is not the secret (the token is).
        await trio.to_thread.run_sync(os.chmod, directory, 0o711)
        path = os.path.join(directory, "gateway.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            os.chmod(path, 0o666)
            listener.listen(128)
            await trio.to_thread.run_sync(_copy_forwarder, directory)
        except BaseException:
            listener.close()
            raise
        record = GatewayRecord(spec=spec)
        token = "acgw-" + secrets.token_urlsafe(24)  # its shape is masked wherever it appears
        # The run's meter (the runtime's client and this gateway share its
        # budgets); outside a run, one of the gateway's own.
        meter = current_meter() or Meter(Limits())
        meter.tighten(max_model_calls)
        app = GatewayApp(client, token, record, meter, spec)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve_asgi, app, listener))
            try:
                inside = await env.expose_socket(path)
            except NotImplementedError:
                raise IssueError(
                    "fatal", "environment_unsupported", f"{type(env).__name__} cannot expose the model gateway"
                ) from None
            forwarder = inside.rsplit("/", 1)[0] + "/forward.py"
            try:
                yield Gateway(token, model.name, inside, forwarder, record, model.api)
            finally:
                app.closed = True
                nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_at(cleanup_deadline(), shield=True):
            await trio.to_thread.run_sync(_remove, directory)


def _copy_forwarder(directory: str) -> None:
    target = os.path.join(directory, "forward.py")
    with open(target, "w") as f:
        f.write(_FORWARDER.read_text())
    os.chmod(target, 0o644)


def _remove(directory: str) -> None:
    # Only the runtime writes there (the session sees it read-only, or is
    # `local`); rmtree never follows a link out of it.
    shutil.rmtree(directory, ignore_errors=True)


def remove_gateway_dirs(tag: str, root: str | None = None) -> list[str]:
    """Remove the gateway directories the run ``tag`` left in ``root`` (the
    host's temporary directory): what a killed run's gateways leave (a socket
    and the forwarder). Returns the paths removed. Only directories named for
    ``tag`` and lying directly in ``root`` are touched; a link is never followed."""
    if not _TAG.fullmatch(tag):
        raise ValueError(f"run tag {tag!r} is not a tag")
    root = os.path.realpath(root or tempfile.gettempdir())
    removed = []
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith(f"{DIR_PREFIX}{tag}-") and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed
