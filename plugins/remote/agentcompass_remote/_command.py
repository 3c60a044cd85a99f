"""The ``compass sandbox`` command group (added to ``compass`` through the
``agentcompass.cli`` entry-point group)."""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agentcompass import ComponentError, ConfigError

if TYPE_CHECKING:
    from ._server import SandboxServer

# The server and trio load inside ``serve``: ``compass --help`` lists this group cheaply.

__all__ = ["sandbox"]


@click.group()
def sandbox() -> None:
    """Host sandboxes for 'remote' drivers.

    Serves sessions of a local provider to drivers on other machines, which
    reach them through the 'remote' environment."""


@sandbox.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=int, default=8765, show_default=True, help="Port to listen on (0: any free port).")
@click.option("--token-file", type=click.Path(path_type=Path), help="File holding the token clients must send.")
@click.option("--provider", default="local", show_default=True, help="Environment id that hosts the sessions.")
@click.option("--provider-config", default="{}", metavar="JSON", help="Default config of that provider.")
@click.option("--capacity", type=int, default=0, show_default=True, help="Most sessions at once (0: no limit).")
@click.option("--grace-seconds", type=float, default=10.0, show_default=True, help="Bound on closing a session.")
@click.option(
    "--auth-timeout-seconds",
    type=float,
    default=5.0,
    show_default=True,
    help="Time from connecting to a good hello (WebSocket upgrade included).",
)
@click.option(
    "--max-unauthenticated",
    type=int,
    default=1024,
    show_default=True,
    help="Most connections not authenticated yet (0: no limit); more are closed at once.",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where open sessions are recorded; a start reaps what a killed server left there. "
    "[default: $XDG_STATE_HOME/agentcompass/sandbox-serve]",
)
def serve(
    host: str,
    port: int,
    token_file: Path | None,
    provider: str,
    provider_config: str,
    capacity: int,
    grace_seconds: float,
    auth_timeout_seconds: float,
    max_unauthenticated: int,
    state_dir: Path | None,
) -> None:
    """Host sandbox sessions over WebSocket until SIGTERM or Ctrl-C, which
    close every session (each within the grace) before exiting."""
    import trio

    from ._server import SandboxServer
    from ._state import default_state_dir

    if token_file is None:
        raise ConfigError("--token-file is required: the server refuses to start without a token")
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"--token-file {str(token_file)!r} cannot be read: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"--token-file {str(token_file)!r} is empty: the server refuses to start without a token")
    for option, value in (
        ("--capacity", capacity),
        ("--grace-seconds", grace_seconds),
        ("--max-unauthenticated", max_unauthenticated),
    ):
        if value < 0:
            raise ConfigError(f"{option} must be >= 0, got {value}")
    if auth_timeout_seconds <= 0:
        raise ConfigError(f"--auth-timeout-seconds must be > 0, got {auth_timeout_seconds}")
    try:
        defaults = json.loads(provider_config)
    except ValueError as exc:
        raise ConfigError(f"--provider-config is not valid JSON: {exc}") from None
    if not isinstance(defaults, dict):
        raise ConfigError(f"--provider-config must be a JSON object, got {provider_config!r}")
    state_dir = state_dir or default_state_dir()
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError(f"--state-dir {str(state_dir)!r} cannot be made: {exc.strerror}") from None
    try:
        server = SandboxServer(
            provider,
            token,
            capacity=capacity,
            grace=grace_seconds,
            auth_timeout=auth_timeout_seconds,
            max_unauthenticated=max_unauthenticated,
            default_config=defaults,
            state_dir=state_dir,
        )
    except ComponentError as exc:
        raise ConfigError(f"--provider {provider!r}: {exc}") from None
    _log_to_stderr()
    trio.run(_serve_until_signal, server, host, port)


def _log_to_stderr() -> None:
    """The server's own log lines (refused accepts, reaped leftovers), one line each."""
    from ._listen import log

    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


async def _serve_until_signal(server: SandboxServer, host: str, port: int) -> None:
    import trio

    from ._server import serve_sandboxes

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_sandboxes, server, host, port)
            print(f"serving {server.provider!r} sandboxes on ws://{host}:{bound}", flush=True)
            async for signum in signals:
                print(
                    f"{signal.Signals(signum).name}: closing {len(server.sessions)} session(s)",
                    file=sys.stderr,
                    flush=True,
                )
                nursery.cancel_scope.cancel()
                break
