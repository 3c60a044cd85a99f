"""The agent table of the ``installed`` harness: what each third-party agent is
and how it runs headless.

An entry is a subclass of :class:`InstalledAgent` registered with
:func:`register_agent`: the distribution to install (and its pinned
version), the model API it speaks, the files it needs written before it
starts, its command line, and how to read what it left in its log
directory. The harness does the rest (the cache, the gateway, the budget,
the outcome); ``docs/agents.md`` walks through adding one.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
from typing import Any, ClassVar, TypeVar

import attrs

from agentcompass import ComponentError, Issue

__all__ = ["AgentOutcome", "AgentRun", "InstalledAgent", "agent_table", "node_platform", "register_agent"]

#: How much of one message's text a trajectory step keeps (as the gateway's record does).
_TEXT_CHARS = 20000


@attrs.frozen
class AgentRun:
    """What an entry builds its command line from. Paths are the session's;
    ``home``, ``logs``, ``url`` and ``token`` are shell expressions
    (``"$AGENT_HOME"`` ...) to use unquoted-safe inside double quotes.

    - ``venv``: a Python agent's installation (read-only), ``python`` its interpreter;
    - ``root``: the agent's cache entry (read-only): an npm agent's native
      executables are ``root/bin/NAME`` (:meth:`binary`);
    - ``home``: a fresh writable directory for the agent's own config and state;
    - ``logs``: the attempt's agent log directory (``/logs/agent``), kept in the run directory;
    - ``url`` / ``token``: the gateway's base URL (ending in ``/v1``) and the attempt's token;
      ``origin``: the same URL without ``/v1``, for clients that add it themselves;
    - ``model``: the model name to ask the gateway for;
    - ``instruction``: the task; ``args``: the user's extra CLI arguments;
    - ``max_turns``: the attempt's ``limits.model_calls`` (or ``max_model_calls``),
      for an agent with a turn or step limit of its own (the gateway enforces it anyway).
    """

    venv: str
    python: str
    instruction: str
    model: str
    args: tuple[str, ...] = ()
    root: str = ""
    home: str = '"$AGENT_HOME"'
    logs: str = '"$AGENT_LOGS"'
    url: str = '"$AGENTCOMPASS_GATEWAY_URL"'
    origin: str = '"${AGENTCOMPASS_GATEWAY_URL%/v1}"'
    token: str = '"$AGENTCOMPASS_GATEWAY_TOKEN"'
    max_turns: int | None = None

    def script(self, name: str) -> str:
        """The shell text that runs the console script ``name`` of the installation
        (through its interpreter: the installation's shebangs name the host's path)."""
        return f"{shlex.quote(self.python)} {shlex.quote(self.venv + '/bin/' + name)}"

    def binary(self, name: str) -> str:
        """The shell text naming the native executable ``name`` of an npm agent's
        entry (a link the cache made to what its platform package brought)."""
        return shlex.quote(f"{self.root}/bin/{name}")


@attrs.frozen
class AgentOutcome:
    """What an entry read from the agent's logs: the final ``output``, its own
    ``trajectory`` steps where its format has them (empty: the harness uses
    the gateway's record of the calls), and ``failure``, an ERROR issue when
    the agent says it stopped short (a step limit, a format failure)."""

    output: Any = None
    trajectory: list[dict[str, Any]] = attrs.Factory(list)
    failure: Issue | None = None


class InstalledAgent:
    """One agent of the table. Subclass it, set the class variables, implement
    :meth:`command` (and :meth:`files`, :meth:`outcome` where needed), and
    decorate it with :func:`register_agent`.

    ClassVars: ``id`` (the ``installed`` harness's ``agent`` key),
    ``distribution`` (its PyPI or npm name), ``version`` (the pinned default),
    ``api`` (the model API it speaks; the request model's must match),
    ``installer`` (``"pip"``: a venv; ``"npm"``: an npm install whose native
    executables, :meth:`binaries`, the session runs directly),
    ``log_files`` (names under the log directory :meth:`outcome` reads).
    """

    id: ClassVar[str]
    distribution: ClassVar[str]
    version: ClassVar[str]
    api: ClassVar[str] = "openai-chat"
    installer: ClassVar[str] = "pip"
    log_files: ClassVar[tuple[str, ...]] = ()
    #: The oldest Python a pip agent runs on (checked inside the session).
    python: ClassVar[tuple[int, int]] = (3, 10)

    def requirements(self, version: str) -> list[str]:
        """What pip (``name==version``) or npm (``name@version``) installs into
        the agent's cache entry for ``version``."""
        if self.installer == "npm":
            return [f"{self.distribution}@{version}"]
        return [f"{self.distribution}=={version}"]

    def binaries(self) -> dict[str, list[str]]:
        """An npm agent's native executables on this host's platform: name ->
        candidate paths under ``node_modules`` (the first that exists is linked
        as ``bin/NAME``; the first name is the one checked to run in the session)."""
        return {}

    def files(self, run: AgentRun) -> dict[str, str]:
        """Files to write under ``home`` before the agent starts (name -> text)."""
        return {}

    def command(self, run: AgentRun) -> str:
        """The shell text that runs the agent headless on ``run.instruction``
        in the task's working directory, its model at the gateway with its
        own retries turned down to at most one, writing its trajectory into
        ``run.logs``. Its exit status is the harness's to interpret."""
        raise NotImplementedError

    def outcome(self, logs: dict[str, bytes], exit_code: int) -> AgentOutcome:
        """Read ``logs`` (the ``log_files`` that exist, each at most 16 MiB;
        what an agent wrote is hostile input: never trust its shape)."""
        return AgentOutcome()


_A = TypeVar("_A", bound=type[InstalledAgent])
_table: dict[str, type[InstalledAgent]] = {}


def register_agent(cls: _A) -> _A:
    """Add ``cls`` to the agent table under ``cls.id`` (a class decorator)."""
    for name in ("id", "distribution", "version"):
        if not isinstance(getattr(cls, name, None), str):
            raise ComponentError(f"agent {cls.__name__}: class variable {name!r} must be a string")
    if cls.installer not in ("pip", "npm"):
        raise ComponentError(f"agent {cls.__name__}: installer must be 'pip' or 'npm', not {cls.installer!r}")
    existing = _table.get(cls.id)
    if existing is not None and existing is not cls and existing.__qualname__ != cls.__qualname__:
        raise ComponentError(f"agent id {cls.id!r} is taken by {existing.__module__}.{existing.__qualname__}")
    _table[cls.id] = cls
    return cls


def agent_table() -> dict[str, type[InstalledAgent]]:
    """The registered agents by id."""
    return dict(_table)


def node_platform() -> tuple[str, str, str]:
    """This host's platform as npm's platform packages name it: ``(os, cpu,
    libc)``, e.g. ``("linux", "x64", "glibc")``; libc is ``"musl"`` on a
    Linux without glibc, ``""`` elsewhere."""
    machine = platform.machine().lower()
    cpu = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    system = "win32" if sys.platform.startswith("win") else sys.platform
    libc = ""
    if system == "linux":
        libc = "glibc" if platform.libc_ver()[0] == "glibc" else "musl"
    return system, cpu, libc


def load_json(data: bytes | None) -> Any:
    """``data`` parsed as JSON, or None."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None


def json_lines(data: bytes | None) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL log, one per line; other lines skipped."""
    found = []
    for line in (data or b"").splitlines():
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def step(role: str, content: Any, *, tool_calls: list[dict[str, str]] | None = None, tool_call_id: Any = None) -> dict[str, Any]:
    """One trajectory entry shaped as the gateway records them: ``role``,
    ``content`` (text, cut to size), ``tool_calls`` (``{id, name, arguments}``)
    and ``tool_call_id`` where given."""
    entry: dict[str, Any] = {"role": role, "content": clip(content)}
    if tool_calls:
        entry["tool_calls"] = tool_calls
    if tool_call_id is not None:
        entry["tool_call_id"] = str(tool_call_id)
    return entry


def clip(content: Any) -> str | None:
    """Text of a message's content (a string, or parts with ``text``), cut to size."""
    if isinstance(content, list):
        content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if not isinstance(content, str):
        return None
    if len(content) > _TEXT_CHARS:
        return content[:_TEXT_CHARS] + f"\n[{len(content) - _TEXT_CHARS} more characters]"
    return content
