"""``noop-agent``: a tiny installed agent for tests and the bench.

Importing this module registers it in the agent table. Its distribution is
a wheel made on the spot (no package index): one module that makes
``calls`` chat-completion calls through the gateway (each resending the
conversation with the previous reply appended), writes what it got to
``noop.json`` in its log directory and exits 0, or 1 on the first failed
call. Each version string is its own cache entry, so a test that wants a
fresh build names a fresh version. Config ``args: ["N"]`` sets the number
of calls (5 by default).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
import zipfile
from typing import ClassVar

from agentcompass.agents import AgentOutcome, AgentRun, InstalledAgent, register_agent

__all__ = ["NoopAgent"]

_MODULE = '''\
import json, os, sys, urllib.error, urllib.request

def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    url = os.environ["AGENTCOMPASS_GATEWAY_URL"] + "/chat/completions"
    token = os.environ["AGENTCOMPASS_GATEWAY_TOKEN"]
    model, log = sys.argv[2], sys.argv[3]
    messages = [{"role": "user", "content": os.environ.get("NOOP_TASK", "task")}]
    replies, status = [], 0
    for _ in range(calls):
        body = json.dumps({"model": model, "messages": messages}).encode()
        request = urllib.request.Request(url, body, {"Authorization": "Bearer " + token,
                                                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                message = json.load(reply)["choices"][0]["message"]
        except urllib.error.HTTPError as exc:
            status = exc.code
            break
        replies.append(message.get("content"))
        messages.append({"role": "assistant", "content": message.get("content")})
        messages.append({"role": "user", "content": "next"})
    with open(log, "w") as f:
        json.dump({"replies": replies, "status": status}, f)
    return 1 if status else 0

if __name__ == "__main__":
    sys.exit(main())
'''


def _wheel(version: str) -> str:
    """Write the agent's wheel for ``version`` (once per content) and return its path."""
    name = f"agentcompass_noop_agent-{version}"
    files = {
        "agentcompass_noop_agent.py": _MODULE.encode(),
        f"{name}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: agentcompass-noop-agent\nVersion: {version}\n"
        ).encode(),
        f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: agentcompass\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    )
    files[f"{name}.dist-info/RECORD"] = (record + f"{name}.dist-info/RECORD,,\n").encode()
    digest = hashlib.sha256(b"".join(files.values())).hexdigest()[:12]
    directory = os.path.join(tempfile.gettempdir(), f"agentcompass-noop-agent-{digest}")
    path = os.path.join(directory, f"{name}-py3-none-any.whl")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with zipfile.ZipFile(tmp, "w") as archive:
            for member, data in files.items():
                archive.writestr(member, data)
        os.replace(tmp, path)
    return path


@register_agent
class NoopAgent(InstalledAgent):
    """See the module docstring."""

    id: ClassVar[str] = "noop-agent"
    distribution: ClassVar[str] = "agentcompass-noop-agent"
    version: ClassVar[str] = "1.0"
    log_files: ClassVar[tuple[str, ...]] = ("noop.json",)

    def requirements(self, version: str) -> list[str]:
        return [_wheel(version)]

    def command(self, run: AgentRun) -> str:
        calls = run.args[0] if run.args else "5"
        return (
            f"NOOP_TASK={_quote(run.instruction)} {_quote(run.python)} -m agentcompass_noop_agent "
            f"{_quote(calls)} {_quote(run.model)} {run.logs}/noop.json"
        )

    def outcome(self, logs: dict[str, bytes], exit_code: int) -> AgentOutcome:
        try:  # the agent wrote it: anything may be in it, or nothing
            data = json.loads(logs.get("noop.json") or b"null")
        except (ValueError, RecursionError):
            data = None
        replies = data.get("replies") if isinstance(data, dict) else None
        return AgentOutcome(output=replies[-1] if isinstance(replies, list) and replies else None)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
