"""Trajectories as the viewer keeps them: the JSON text of their chunks.

A record's trajectories are split into chunks of :data:`CHUNK_STEPS`
messages kept as JSON text (far smaller than the parsed messages), so a
chunk request slices text and never parses the record again. A large file's
trajectories are located and scanned one message at a time (the rest of the
file is parsed with them cut out), so other threads, and the server's event
loop, run between messages instead of waiting for one 50 MB parse.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["CHUNK_STEPS", "LARGE_RECORD", "RawJSON", "Trajectory", "read_record", "run_results"]

#: Messages per trajectory chunk: small enough to parse and render in a frame.
CHUNK_STEPS = 500
#: Records at least this large are split as they are read (and summarized by
#: the background pass rather than by a page request).
LARGE_RECORD = 256 * 1024
_TRAJECTORY_KEY = re.compile(r'"trajectory"[ \t\n\r]*:[ \t\n\r]*\[')
_WS = re.compile(r"[ \t\n\r]*")
_MARK = "\u0000compass-trajectory-"


class RawJSON(str):
    """JSON text to send as it is (a trajectory chunk, already serialized)."""


class Trajectory:
    """A trajectory kept as the JSON text of its chunks (far smaller than the
    parsed messages), with the counts the attempt page shows."""

    __slots__ = ("chunks", "steps", "tool_calls")

    def __init__(self, chunks: list[str], steps: int, tool_calls: int) -> None:
        self.chunks = chunks
        self.steps = steps
        self.tool_calls = tool_calls

    @classmethod
    def of(cls, messages: Any) -> Trajectory:
        messages = messages if isinstance(messages, list) else []
        chunks = [json.dumps(messages[i : i + CHUNK_STEPS], separators=(",", ":"), default=str, ensure_ascii=False)
                  for i in range(0, len(messages), CHUNK_STEPS)]
        return cls(chunks, len(messages), sum(_tool_calls(m) for m in messages))

    @property
    def chars(self) -> int:
        return sum(len(c) for c in self.chunks)

    def group(self, index: int, size: int) -> str | None:
        """Chunks ``index * size`` to ``index * size + size - 1`` as one JSON
        array (the static site's fewer, larger files); None past the end."""
        parts = self.chunks[index * size : index * size + size]
        if not parts:
            return "[]" if index == 0 and not self.chunks else None
        return "[" + ",".join(p[1:-1] for p in parts if len(p) > 2) + "]"

    def find(self, query: str) -> list[int]:
        """The chunks whose text holds ``query`` (case-insensitively, as it
        is written in JSON): every chunk with a matching message, and maybe
        a few more (a match in a key or across fields) that the page, which
        matches message by message, passes over."""
        query = query.lower()
        needles = {json.dumps(query, ensure_ascii=False)[1:-1], json.dumps(query)[1:-1]}
        needles.discard("")
        if not needles:
            return []
        return [n for n, chunk in enumerate(self.chunks) if any(needle in chunk.lower() for needle in needles)]


def read_record(path: str) -> tuple[Any, int]:
    """A record or checkpoint with every ``run_result.trajectory`` as a
    :class:`Trajectory`, and the characters it holds (for the cache bound).

    A large file's trajectories are located and scanned one message at a time
    (the rest of the file is parsed with them cut out), so the interpreter
    switches threads between messages instead of holding the lock for the
    whole parse; anything unexpected falls back to one plain parse."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")
    if len(text) >= LARGE_RECORD:
        try:
            return _read_split(text), len(text)
        except (ValueError, IndexError, StopIteration):
            pass
    value = json.loads(text)
    for run_result in run_results(value):
        run_result["trajectory"] = Trajectory.of(run_result.get("trajectory"))
    return value, len(text)


def _read_split(text: str) -> Any:
    pieces: list[str] = []
    trajectories: list[Trajectory] = []
    pos = 0
    while match := _TRAJECTORY_KEY.search(text, pos):
        start = match.end() - 1
        trajectory, end = _scan_array(text, start)
        pieces += [text[pos:start], json.dumps(f"{_MARK}{len(trajectories)}")]
        trajectories.append(trajectory)
        pos = end
    pieces.append(text[pos:])
    value = json.loads("".join(pieces))
    placed = 0
    for run_result in run_results(value):
        mark = run_result.get("trajectory")
        if isinstance(mark, str) and mark.startswith(_MARK):
            run_result["trajectory"] = trajectories[int(mark[len(_MARK):])]
            placed += 1
        elif "trajectory" in run_result:
            run_result["trajectory"] = Trajectory.of(mark)
    if placed != len(trajectories):
        raise ValueError("a trajectory key outside a run result")
    return value


_DECODER = json.JSONDecoder()


def _scan_array(text: str, start: int) -> tuple[Trajectory, int]:
    """The array of messages opening at ``text[start]`` ('['), as chunk texts
    sliced from ``text``, and the index after its ']'."""
    scan = _DECODER.scan_once
    ws = _WS.match
    bounds: list[int] = []
    tool_calls = 0
    i = ws(text, start + 1).end()
    if text[i] == "]":
        return Trajectory([], 0, 0), i + 1
    while True:
        message, end = scan(text, i)
        bounds.append(i)
        tool_calls += _tool_calls(message)
        i = ws(text, end).end()
        if text[i] == ",":
            i = ws(text, i + 1).end()
            continue
        if text[i] != "]":
            raise ValueError(f"unexpected {text[i]!r} in a trajectory")
        bounds.append(end)  # the end of the last message
        break
    steps = len(bounds) - 1
    chunks = []
    for first in range(0, steps, CHUNK_STEPS):
        last = min(first + CHUNK_STEPS, steps)
        stop = bounds[last] if last == steps else text.rindex(",", bounds[last - 1], bounds[last])
        chunks.append("[" + text[bounds[first]:stop] + "]")
    return Trajectory(chunks, steps, tool_calls), i + 1


def run_results(value: Any) -> list[dict[str, Any]]:
    """The run results of a record (its attempts') or of one attempt."""
    if not isinstance(value, dict):
        return []
    attempts = value.get("attempts") if "attempts" in value else [value]
    found = []
    for attempt in attempts if isinstance(attempts, list) else []:
        run_result = attempt.get("run_result") if isinstance(attempt, dict) else None
        if isinstance(run_result, dict):
            found.append(run_result)
    return found


def _tool_calls(message: Any) -> int:
    return len(message.get("tool_calls") or []) if isinstance(message, dict) else 0
