"""Task keys: a filename for any task id.

A task id is whatever string a benchmark chose; a task key is what the store
uses as a file or directory name for it (``details/normal/<key>.json``,
``tasks/<key>/``). The encoding is:

- **identity** for plain ids: lowercase ASCII letters, digits, ``.``, ``_``
  and ``-``, starting with a letter or digit, not ending with ``.``, at most
  :data:`PLAIN_MAX` characters and not a Windows device name (``con``,
  ``nul``, ``com1``...). ``task-001`` is stored as ``task-001``.
- otherwise **prefix~digest**: a readable prefix (the id's first characters with
  anything outside ``[A-Za-z0-9._-]`` replaced by ``_``, lowercased, leading dots
  dropped) then ``~`` then 20 hex digits of the SHA-256 of the full id.

Why it is collision-free, also on case-insensitive filesystems: a plain key
never contains ``~`` and a hashed key always does, so the two kinds never meet;
two plain keys are the (distinct) ids themselves; two hashed keys differ in
their digest unless SHA-256 truncated to 80 bits collides. Every key is already
lowercase ASCII, so ``casefold()`` changes nothing and ids differing only in
case (``Task`` vs ``task``) still get different keys. Keys are at most 120
bytes, never ``.`` or ``..``, never hidden (no leading ``.``: the store's
temporary files are the hidden ones), and contain no ``/``, ``\\``, NUL or
control character.

Non-goal: keys are not reversible. Every stored JSON file carries its task id,
so readers never decode a key.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["task_key"]

#: The longest id that is used as its own key.
PLAIN_MAX = 120
_PREFIX_MAX = 80
_DIGEST_CHARS = 20

_PLAIN = re.compile(r"[a-z0-9][a-z0-9._-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_WINDOWS_DEVICES = frozenset(
    ["con", "prn", "aux", "nul"] + [f"com{i}" for i in range(10)] + [f"lpt{i}" for i in range(10)]
)


def task_key(task_id: str) -> str:
    """The filename-safe, collision-free key of ``task_id`` (see the module doc)."""
    if (
        len(task_id) <= PLAIN_MAX
        and _PLAIN.fullmatch(task_id)
        and not task_id.endswith(".")
        and task_id.partition(".")[0] not in _WINDOWS_DEVICES
    ):
        return task_id
    # surrogatepass: str -> bytes must be injective even for lone surrogates.
    digest = hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()
    # Substitute before lowercasing: only ASCII is left to lowercase, so the
    # prefix length cannot grow (``"İ".lower()`` is two characters).
    prefix = _UNSAFE.sub("_", task_id[:_PREFIX_MAX]).lower().lstrip(".")
    return f"{prefix or '_'}~{digest[:_DIGEST_CHARS]}"
