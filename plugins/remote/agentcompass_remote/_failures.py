"""How the remote client reports failures: a lost server or session is FATAL
``environment_failed``, and a server's error reply becomes the exception its
provider raised (``FileRefusedError``, ``NotImplementedError``, ``OSError``,
an ``IssueError``)."""

from __future__ import annotations

from typing import Any, Literal

import trio

from agentcompass import FileRefusedError, IssueError

from . import _protocol as p

__all__ = ["check_path", "fail", "reason", "reply_error"]


def fail(message: str) -> IssueError:
    return IssueError("fatal", "environment_failed", message)


def check_path(path: str) -> None:
    try:
        p.check_path(path)
    except p.ProtocolError as exc:
        raise fail(str(exc)) from None


def reason(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "no answer in time"
    return " ".join(str(exc).split()) or type(exc).__name__


def reply_error(reply: dict[str, Any]) -> Exception:
    message = str(reply.get("message") or "the server reported an error")
    if reply.get("code") == p.FILE_REFUSED:
        return FileRefusedError(message)
    if reply.get("code") == p.NOT_IMPLEMENTED:
        return NotImplementedError(message)
    errno = reply.get("errno")
    if isinstance(errno, int):
        return OSError(errno, message)
    severity: Literal["fatal", "error", "warning"] = "fatal"
    if reply.get("severity") in ("error", "warning"):
        severity = reply["severity"]
    return IssueError(severity, str(reply.get("code") or "environment_failed"), message)
