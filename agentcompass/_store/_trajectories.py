"""Long trajectories beside their record (SPEC 8, docs/results.md).

An attempt whose trajectory has more than :data:`TRAJECTORY_CHUNK` messages
is written with its messages in files of :data:`TRAJECTORY_CHUNK` each,
``RunLayout.chunk`` (``tasks/<task key>/attempt-<n>/trajectory/<i>.json``, a JSON array each),
and its ``run_result.trajectory`` in the record (and in the checkpoint) is a
reference::

    {"split": 500, "messages": 200002, "tool_calls": 100000}

So the runtime never builds one JSON text of a 50 MB trajectory (each chunk
is serialized and masked on its own), and a reader fetches a range of
messages by reading only the chunks that hold it. The chunks are written in
the same batch as the record and renamed before it, so a record never names
chunks that are not there. The loader joins them back: a record in memory,
reused or shown, is whole.

Not a goal: sharing chunks between the checkpoint and the record of one
attempt; the record rewrites them (same paths, same content).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._layout import RunLayout

__all__ = ["TRAJECTORY_CHUNK", "join_trajectories", "split_reference", "split_trajectories"]

#: Messages per trajectory file; a trajectory this long or shorter stays in its record.
TRAJECTORY_CHUNK = 500


def split_trajectories(attempts: list[Any], layout: RunLayout, key: str) -> list[tuple[str, list[Any]]]:
    """Replace each long trajectory in ``attempts`` (unstructured attempt
    records, changed in place) by its reference; the chunk files to write,
    as (path, messages), in order."""
    chunks: list[tuple[str, list[Any]]] = []
    for attempt in attempts:
        run_result = attempt.get("run_result") if isinstance(attempt, dict) else None
        if not isinstance(run_result, dict):
            continue
        trajectory = run_result.get("trajectory")
        if not isinstance(trajectory, list) or len(trajectory) <= TRAJECTORY_CHUNK:
            continue
        number = int(attempt["attempt"])
        for index, start in enumerate(range(0, len(trajectory), TRAJECTORY_CHUNK)):
            chunks.append((layout.chunk(key, number, index), trajectory[start : start + TRAJECTORY_CHUNK]))
        calls = sum(len(m.get("tool_calls") or ()) for m in trajectory if isinstance(m, dict))
        run_result["trajectory"] = {"split": TRAJECTORY_CHUNK, "messages": len(trajectory), "tool_calls": calls}
    return chunks


def split_reference(trajectory: Any) -> tuple[int, int, int] | None:
    """(messages per chunk, messages, tool calls) of a reference, else None."""
    if not isinstance(trajectory, dict):
        return None
    numbers = (trajectory.get("split"), trajectory.get("messages"), trajectory.get("tool_calls", 0))
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers) or not numbers[0]:
        raise ValueError("a trajectory reference needs integer split, messages and tool_calls")
    return int(numbers[0]), int(numbers[1]), int(numbers[2])  # type: ignore[arg-type]


def join_trajectories(attempts: Any, layout: RunLayout, key: str, read: Callable[[str], list[Any]]) -> bool:
    """Replace each reference in ``attempts`` (changed in place) by the
    messages its chunk files hold (``read``: path -> the array in it);
    whether there was any. Raises ``OSError`` or ``ValueError`` when a chunk
    is missing or the messages do not add up."""
    joined = False
    for attempt in attempts if isinstance(attempts, list) else []:
        run_result = attempt.get("run_result") if isinstance(attempt, dict) else None
        if not isinstance(run_result, dict):
            continue
        reference = split_reference(run_result.get("trajectory"))
        if reference is None:
            continue
        split, count, _ = reference
        number = int(attempt.get("attempt"))  # type: ignore[arg-type]
        messages: list[Any] = []
        for index in range(-(-count // split)):
            chunk = read(layout.chunk(key, number, index))
            if not isinstance(chunk, list):
                raise ValueError(f"trajectory chunk {index} is not a JSON array")
            messages.extend(chunk)
        if len(messages) != count:
            raise ValueError(f"the trajectory's chunks hold {len(messages)} messages, not {count}")
        run_result["trajectory"] = messages
        joined = True
    return joined
