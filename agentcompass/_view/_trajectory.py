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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast, overload

from .._store._trajectories import TRAJECTORY_CHUNK, split_reference

#: Where chunk ``index`` of attempt ``attempt``'s trajectory is (the run's layout, for one task).
ChunkPath = Callable[[int, int], str]

__all__ = ["CHUNK_STEPS", "LARGE_RECORD", "FileChunks", "RawJSON", "Trajectory", "read_record"]

#: Messages per trajectory chunk: small enough to parse and render in a frame,
#: and the store's, so that its chunk files are served as they are.
CHUNK_STEPS = TRAJECTORY_CHUNK
#: Records at least this large are split as they are read (and summarized by
#: the background pass rather than by a page request).
LARGE_RECORD = 256 * 1024
_TRAJECTORY_KEY = re.compile(r'"trajectory"[ \t\n\r]*:[ \t\n\r]*\[')
_WS = re.compile(r"[ \t\n\r]*")
_MARK = "\u0000compass-trajectory-"


class RawJSON(str):
    """JSON text to send as it is (a trajectory chunk, already serialized)."""


class FileChunks(Sequence[str]):
    """The chunk files of a trajectory the store wrote beside its record
    (``path(i)``, see ``RunLayout.chunk``), read when asked for: nothing is held."""

    def __init__(self, path: Callable[[int], str], count: int) -> None:
        self.path = path
        self._count = count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        with open(self.path(index % self._count), "rb") as f:
            return f.read().decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(self._count))


class Trajectory:
    """A trajectory kept as the JSON text of its chunks (far smaller than the
    parsed messages), or read chunk by chunk from the files the store wrote
    beside its record, with the counts the attempt page shows."""

    __slots__ = ("chunks", "steps", "tool_calls")

    def __init__(self, chunks: Sequence[str], steps: int, tool_calls: int) -> None:
        self.chunks = chunks
        self.steps = steps
        self.tool_calls = tool_calls

    @classmethod
    def beside(cls, path: Callable[[int], str], split: int, steps: int, tool_calls: int) -> Trajectory:
        """The trajectory in the chunk files ``path(i)`` (``split``
        messages each): served file by file when its chunks are the viewer's."""
        files = FileChunks(path, -(-steps // split))
        if split == CHUNK_STEPS:
            return cls(files, steps, tool_calls)
        return cls.of([m for text in files for m in json.loads(text)])

    @classmethod
    def of(cls, messages: Any) -> Trajectory:
        messages = messages if isinstance(messages, list) else []
        chunks = [json.dumps(messages[i : i + CHUNK_STEPS], separators=(",", ":"), default=str, ensure_ascii=False)
                  for i in range(0, len(messages), CHUNK_STEPS)]
        return cls(chunks, len(messages), sum(_tool_calls(m) for m in messages))

    @property
    def chars(self) -> int:
        """Characters held in memory (none for chunk files)."""
        return 0 if isinstance(self.chunks, FileChunks) else sum(len(c) for c in self.chunks)

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


def read_record(path: str, chunk_path: ChunkPath | None = None) -> tuple[Any, int]:
    """A record or checkpoint with every ``run_result.trajectory`` as a
    :class:`Trajectory`, and the characters it holds (for the cache bound).
    A trajectory the store wrote beside the record is read from its chunk
    files (``chunk_path(attempt, i)``) when asked for.

    A large file's trajectories are located and scanned one message at a time
    (the rest of the file is parsed with them cut out), so the interpreter
    switches threads between messages instead of holding the lock for the
    whole parse; anything unexpected falls back to one plain parse."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")
    if len(text) >= LARGE_RECORD:
        try:
            return _read_split(text, chunk_path), len(text)
        except (ValueError, IndexError, StopIteration):
            pass
    value = json.loads(text)
    for attempt, run_result in _attempt_results(value):
        run_result["trajectory"] = _trajectory(run_result.get("trajectory"), attempt, chunk_path)
    return value, len(text)


def _trajectory(value: Any, attempt: dict[str, Any], chunk_path: ChunkPath | None) -> Trajectory:
    """A run result's ``trajectory`` (messages, or a reference to chunk files) as a :class:`Trajectory`."""
    reference = split_reference(value)
    if reference is None or chunk_path is None:
        return Trajectory.of(value)
    number = int(attempt.get("attempt"))  # type: ignore[arg-type]
    return Trajectory.beside(lambda index: chunk_path(number, index), *reference)


def _read_split(text: str, chunk_path: ChunkPath | None) -> Any:
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
    for attempt, run_result in _attempt_results(value):
        mark = run_result.get("trajectory")
        if isinstance(mark, str) and mark.startswith(_MARK):
            run_result["trajectory"] = trajectories[int(mark[len(_MARK):])]
            placed += 1
        elif "trajectory" in run_result:
            run_result["trajectory"] = _trajectory(mark, attempt, chunk_path)
    if placed != len(trajectories):
        raise ValueError("a trajectory key outside a run result")
    return value


_DECODER = json.JSONDecoder()


def _scan_array(text: str, start: int) -> tuple[Trajectory, int]:
    """The array of messages opening at ``text[start]`` ('['), as chunk texts
    sliced from ``text``, and the index after its ']'."""
    scan: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]  # CPython's scanner; not in typeshed
    ws = cast("Callable[[str, int], re.Match[str]]", _WS.match)  # matches the empty string: never None
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


def _attempt_results(value: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(attempt, run result) of a record's attempts, of one attempt, or of a
    checkpoint as the store writes it (``{"task_id", "record"}``)."""
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("record"), dict) and "attempts" not in value:
        value = value["record"]
    attempts = value.get("attempts") if "attempts" in value else [value]
    found = []
    for attempt in attempts if isinstance(attempts, list) else []:
        run_result = attempt.get("run_result") if isinstance(attempt, dict) else None
        if isinstance(run_result, dict):
            found.append((attempt, run_result))
    return found


def _tool_calls(message: Any) -> int:
    return len(message.get("tool_calls") or []) if isinstance(message, dict) else 0
