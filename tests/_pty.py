"""A command run with a pseudo-terminal as its stdout and stderr, as a
person at a terminal runs it (``tests/`` is on ``sys.path``)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
from pathlib import Path

__all__ = ["plain_lines", "run_on_pty"]

_ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|[()][A-Z0-9])")


def run_on_pty(command: list[str], cwd: Path, env: dict[str, str], seconds: float = 120) -> tuple[int, str]:
    """Run ``command`` on a new pseudo-terminal; its exit code and all it
    wrote there (escape sequences included) once it closed the terminal.
    Fails if it writes nothing for ``seconds``."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    finally:
        os.close(terminal)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([controller], [], [], seconds)
            assert ready, f"{command} wrote nothing for {seconds} s"
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=seconds)
    finally:
        os.close(controller)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, b"".join(chunks).decode("utf-8", "replace")


def plain_lines(output: str) -> list[str]:
    """``output`` as the lines a person saw: escape sequences dropped, ends stripped."""
    text = output.replace("\r\n", "\n").replace("\r", "\n")
    return [_ESCAPES.sub("", line).rstrip() for line in text.split("\n")]
