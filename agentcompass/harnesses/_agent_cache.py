"""The host-side cache of installed agents: one build per host, agent and version.

An entry is ``<root>/<agent>-<version>/``: for a Python agent a virtual
environment (``venv/``) made with the host's Python and the agent's pinned
distribution installed into it from the package index pip is configured
for; for an npm agent the pinned package installed with the host's ``npm``
into ``npm/`` (from the registry npm is configured for; install scripts
off) and, under ``bin/``, relative links to the native executables its
platform package brought (so the session runs them directly, with no
Node.js); and ``installed.json`` written last (what was installed, how long
it took). An entry without ``installed.json`` is an interrupted build and
is built again. ``<root>`` is ``$AGENTCOMPASS_AGENT_CACHE``, else
``${XDG_CACHE_HOME:-~/.cache}/agentcompass/agents``. The interpreter is the
system's ``python3`` (:func:`host_python`).

Builds are serialized per entry by an exclusive ``flock`` on
``<root>/<agent>-<version>.lock``, so concurrent attempts, requests and
processes wait for one build and then share it (``agentcompass.host.FileLock``). The entry is
world-readable and never written after it is complete: sessions see it
read-only (``EnvironmentSession.expose_directory``).

An entry's key comes from config (the agent id and ``version``), so it is
checked twice: at load (:func:`path_component`: one plain name, so
``compass validate`` refuses ``1.0/../../x`` with exit 2) and here, where the
entry and its lock are resolved and must lie directly in the cache's root
before anything is created, locked or removed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from agentcompass import IssueError
from agentcompass.host import FileLock

__all__ = ["CacheEntry", "cache_root", "ensure_installed", "host_npm", "path_component"]

#: A config value that becomes one path component: a plain name, never ``..`` nor a separator.
_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@-]{0,127}")


def path_component(instance: Any, attribute: Any, value: Any) -> None:
    """An ``attrs`` validator: ``value`` must be a plain name (it becomes a path component)."""
    if not isinstance(value, str) or not _COMPONENT.fullmatch(value) or ".." in value:
        raise ValueError(
            f"{attribute.name} {value!r} must be a plain name of letters, digits and ._+@- (it names a directory)"
        )


def _inside(root: Path, key: str) -> Path:
    """``root/key``, resolved, once it is certain to lie directly in ``root``."""
    if not _COMPONENT.fullmatch(key) or ".." in key:
        raise IssueError("fatal", "setup_failed", f"agent cache key {key!r} is not a plain name")
    base = root.resolve()
    entry = (base / key).resolve()
    if entry.parent != base:
        raise IssueError("fatal", "setup_failed", f"agent cache entry {key!r} resolves outside {base}")
    return entry


@attrs.frozen
class CacheEntry:
    """A complete entry: its directory, and whether this call built it (and how long that took)."""

    path: Path
    built: bool
    install_seconds: float


def cache_root() -> Path:
    explicit = os.environ.get("AGENTCOMPASS_AGENT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentcompass" / "agents"


async def ensure_installed(
    key: str,
    requirements: list[str],
    *,
    root: Path | None = None,
    installer: str = "pip",
    binaries: dict[str, list[str]] | None = None,
) -> CacheEntry:
    """The complete cache entry ``key`` (``<agent>-<version>``), building it
    first if no complete one exists: with pip from ``requirements`` into a
    venv (``installer="pip"``), or with npm (``installer="npm"``), linking
    ``bin/<name>`` to the first of ``binaries[name]`` (paths under
    ``node_modules``) that the install brought.

    A failed build raises FATAL ``agent_install_failed`` with the
    installer's last lines, or naming the executable none of whose
    candidates exist (the partial entry is removed; the next attempt builds
    again). Cancellation stops the installer and leaves an incomplete entry
    that the next build replaces."""
    root = cache_root() if root is None else root
    await trio.to_thread.run_sync(_make_root, root)
    entry = await trio.to_thread.run_sync(_inside, root, key)
    root = entry.parent
    if await trio.Path(entry / "installed.json").is_file():
        return CacheEntry(entry, False, 0.0)
    await trio.to_thread.run_sync(_make_root, root)
    async with FileLock.open(root / f"{key}.lock"):
        if await trio.Path(entry / "installed.json").is_file():
            return CacheEntry(entry, False, 0.0)
        start = time.monotonic()
        if installer == "npm":
            await _build_npm(entry, requirements, binaries or {})
        else:
            await _build(entry, requirements)
        return CacheEntry(entry, True, time.monotonic() - start)


def _make_root(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(root, 0o755)


#: Where a session that runs on the host's userland (``sandbox``) finds a Python.
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def host_python() -> str:
    """The interpreter new agent environments are made with: ``$AGENTCOMPASS_AGENT_PYTHON``,
    else the system's ``python3`` (under ``/usr``, which sessions on the host's
    userland see too; a venv links to its interpreter, so one under a home
    directory would not run there), else the runtime's own base interpreter."""
    explicit = os.environ.get("AGENTCOMPASS_AGENT_PYTHON")
    if explicit:
        return explicit
    for candidate in _SYSTEM_PYTHONS:
        if os.access(candidate, os.X_OK):
            return candidate
    return getattr(sys, "_base_executable", None) or os.path.realpath(sys.executable)


async def _build(entry: Path, requirements: list[str]) -> None:
    await trio.to_thread.run_sync(_clear, entry)
    venv = entry / "venv"
    python = str(venv / "bin" / "python")
    pip_options = ["install", "--no-input", "--disable-pip-version-check", "--no-warn-script-location", "-q"]
    if importlib.util.find_spec("pip") is not None:
        # The runtime's own pip installs into the new environment: no pip
        # bootstrapped into each entry (ensurepip is most of a small build).
        steps = [
            [host_python(), "-m", "venv", "--without-pip", str(venv)],
            [sys.executable, "-m", "pip", "--python", python, *pip_options, *requirements],
        ]
    else:
        steps = [[host_python(), "-m", "venv", str(venv)], [python, "-m", "pip", *pip_options, *requirements]]
    start = time.monotonic()
    for argv in steps:
        await _run(entry, requirements, argv)
    info: dict[str, Any] = {
        "requirements": requirements,
        "python": host_python(),
        "install_seconds": round(time.monotonic() - start, 3),
        "created": time.time(),
    }
    await trio.to_thread.run_sync(_finish, entry, info)


async def _run(entry: Path, requirements: list[str], argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run one build step; on failure clear the entry and raise FATAL ``agent_install_failed``."""
    try:
        result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, stdin=b"", env=env)
        failed, output = result.returncode != 0, result.stderr or result.stdout
    except OSError as exc:  # the installer itself is missing or not executable
        failed, output = True, str(exc).encode()
    if failed:
        tail = " ".join(output.decode(errors="replace").split())[-400:]
        await trio.to_thread.run_sync(_clear, entry)
        raise IssueError(
            "fatal",
            "agent_install_failed",
            f"installing {' '.join(requirements)} failed ({' '.join(argv[1:4])}): {tail}",
        )


def host_npm() -> str | None:
    """The ``npm`` new npm entries are installed with: ``$AGENTCOMPASS_AGENT_NPM``, else ``npm`` on ``PATH``."""
    return os.environ.get("AGENTCOMPASS_AGENT_NPM") or shutil.which("npm")


async def _build_npm(entry: Path, requirements: list[str], binaries: dict[str, list[str]]) -> None:
    await trio.to_thread.run_sync(_clear, entry)
    npm = host_npm()
    if npm is None:
        raise IssueError("fatal", "agent_install_failed", f"installing {' '.join(requirements)} needs npm on the host")
    prefix = entry / "npm"
    # Install scripts off: the platform package already holds the native
    # executable, which bin/ links to (a postinstall would only copy it).
    argv = [
        npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-update-notifier",
        "--ignore-scripts", "--omit=dev", "--loglevel=error", *requirements,
    ]  # fmt: skip
    start = time.monotonic()
    await trio.to_thread.run_sync(partial(prefix.mkdir, parents=True))
    await _run(entry, requirements, argv, env={**os.environ, "NO_UPDATE_NOTIFIER": "1"})
    try:
        linked = await trio.to_thread.run_sync(_link_binaries, entry, binaries)
    except FileNotFoundError as exc:
        await trio.to_thread.run_sync(_clear, entry)
        raise IssueError("fatal", "agent_install_failed", f"installing {' '.join(requirements)}: {exc}") from None
    info: dict[str, Any] = {
        "requirements": requirements,
        "npm": npm,
        "binaries": linked,
        "install_seconds": round(time.monotonic() - start, 3),
        "created": time.time(),
    }
    await trio.to_thread.run_sync(_finish, entry, info)


def _link_binaries(entry: Path, binaries: dict[str, list[str]]) -> dict[str, str]:
    """Link ``bin/<name>`` to the first candidate that exists (relative, so the
    link resolves wherever the entry is mounted); name -> its target."""
    modules = entry / "npm" / "node_modules"
    (entry / "bin").mkdir()
    linked = {}
    for name, candidates in binaries.items():
        found = next((c for c in candidates if (modules / c).is_file() and not (modules / c).is_symlink()), None)
        if found is None:
            raise FileNotFoundError(f"no executable {name!r} for this platform (looked for {', '.join(candidates)})")
        target = os.path.join("..", "npm", "node_modules", found)
        os.symlink(target, entry / "bin" / name)
        linked[name] = found
    return linked


def _clear(entry: Path) -> None:
    if entry.exists():
        shutil.rmtree(entry)
    entry.mkdir(parents=True)


def _finish(entry: Path, info: dict[str, Any]) -> None:
    """Make the entry readable by the sessions' users, then mark it complete."""
    for parent, dirs, files in os.walk(entry):
        for name in dirs:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o555)
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444)
    os.chmod(entry, 0o755)
    tmp = entry / "installed.json.tmp"
    tmp.write_text(json.dumps(info))
    os.rename(tmp, entry / "installed.json")
