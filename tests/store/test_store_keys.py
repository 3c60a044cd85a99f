"""Task keys: readable, filename-safe, injective (also across letter case)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompass._store import task_key
from agentcompass._store._keys import PLAIN_MAX

MAX_KEY_BYTES = 150


def assert_filename_safe(key: str) -> None:
    assert key not in ("", ".", "..")
    assert not key.startswith(".")  # hidden names are the store's temp files
    assert "/" not in key and "\\" not in key and "\0" not in key
    assert all(c.isprintable() for c in key)
    assert len(key.encode()) <= MAX_KEY_BYTES
    assert key == key.casefold()


def test_plain_ids_are_their_own_key() -> None:
    for task_id in ["task-001", "a", "0", "gsm8k_17", "swe.bench-42", "x" * PLAIN_MAX]:
        assert task_key(task_id) == task_id


def test_awkward_ids_get_readable_hashed_keys() -> None:
    awkward = [
        "", ".", "..", "../etc/passwd", "a/b", "a\\b", "Task-001", "TASK-001", "con", "nul.txt",
        "trailing.", "x" * (PLAIN_MAX + 1), "nul\0byte", "tab\there", "ünïcödé", "\ud800",
        "~", "a~b", " ", "İ" * 200,
    ]
    keys = [task_key(t) for t in awkward]
    for task_id, key in zip(awkward, keys, strict=True):
        assert_filename_safe(key)
        assert "~" in key, task_id
    assert len(set(keys)) == len(awkward)
    assert task_key("a/b").startswith("a_b~")
    assert task_key("Task-001").startswith("task-001~")


def _variants(task_id: str) -> list[str]:
    # Near-collisions: case changes and what sanitizing or truncation would merge.
    return [
        task_id,
        task_id.upper(),
        task_id.lower(),
        task_id.swapcase(),
        task_id.replace("/", "_"),
        task_id + "/",
        task_id[:PLAIN_MAX],
        task_id + "x" * PLAIN_MAX,
    ]


ids = st.one_of(
    st.text(),
    st.text(alphabet="aAbB_-./~\\ \0é", max_size=12),
    st.text(alphabet="abc-", min_size=PLAIN_MAX - 2, max_size=PLAIN_MAX + 2),
)


@settings(max_examples=300)
@given(st.lists(ids, min_size=1, max_size=8))
def test_task_key_is_injective_and_safe(seed: list[str]) -> None:
    task_ids = sorted({v for task_id in seed for v in _variants(task_id)})
    keys = [task_key(t) for t in task_ids]
    for key in keys:
        assert_filename_safe(key)
    assert len(set(keys)) == len(task_ids)
    assert len({k.casefold() for k in keys}) == len(task_ids)
    assert [task_key(t) for t in task_ids] == keys  # deterministic
