"""YAML within limits (config step 0): nesting and alias expansion bounded while the document is composed, so a bomb costs what its text costs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import yaml

from .runtime._errors import ConfigError

__all__ = ["MAX_ALIAS_VALUES", "MAX_NESTING", "check_nesting", "one_line", "safe_load", "yaml_where"]

#: The deepest nesting of mappings and lists a config may have, counting the
#: top-level mapping as 1 and a value reached through an alias as if written
#: out there. Deeper is refused while parsing, before the parser's own
#: recursion (or any later walk of the data) can overflow the stack.
MAX_NESTING = 100
#: How many values (scalars, lists and mappings) all the aliases of one
#: document may add when written out in full. A few anchors for a shared model
#: block add tens; a "billion laughs" document (aliases of aliases of lists)
#: would add ~10**9 from a few hundred bytes, and is refused while parsing.
MAX_ALIAS_VALUES = 100_000
_SHOWN_PATH_PARTS = 8


class _LimitError(yaml.MarkedYAMLError):
    """A document beyond :data:`MAX_NESTING` or :data:`MAX_ALIAS_VALUES`."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses, while composing, nesting deeper than
    :data:`MAX_NESTING`, aliases that add more than :data:`MAX_ALIAS_VALUES`
    values, and recursive aliases (``&a [*a]``).

    Composition is where a document's size can explode: an alias is one event
    but stands for its whole anchored node. Each finished collection's height
    and written-out size are recorded (an alias only ever names a finished
    node, or an open one, which is recursion), so the check costs one pass
    over the nodes as written, never the expansion. Construction then builds
    the same shared objects ``yaml.safe_load`` would.
    """

    def __init__(self, stream: str, depth: int = 0, where: Sequence[str] = ()) -> None:
        super().__init__(stream)
        self._depth = depth  # collections open around the next node
        self._where = list(where)  # the key path to the next node, for messages
        self._shapes: dict[int, tuple[int, int]] = {}  # id(collection node): (height, written-out size)
        self._alias_values = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        label = _label(parent, index)
        if label:
            self._where.append(label)
        try:
            if self.check_event(yaml.AliasEvent):
                return self._compose_alias(parent, index)
            event = self.peek_event()
            if not isinstance(event, yaml.CollectionStartEvent):
                return super().compose_node(parent, index)
            if self._depth >= MAX_NESTING:
                self._refuse(f"nesting deeper than {MAX_NESTING} levels", event.start_mark)
            self._depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            self._shapes[id(node)] = _shape(node, self._shapes)
            return node
        finally:
            if label:
                self._where.pop()

    def _compose_alias(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        node = self.anchors.get(event.anchor)
        if isinstance(node, yaml.CollectionNode):
            shape = self._shapes.get(id(node))
            if shape is None:
                self._refuse(f"recursive alias *{event.anchor} (it is inside its own anchor)", event.start_mark)
            height, size = shape
            if self._depth + height > MAX_NESTING:
                self._refuse(
                    f"nesting deeper than {MAX_NESTING} levels through alias *{event.anchor}", event.start_mark
                )
        else:
            size = 1
        self._alias_values += size
        if self._alias_values > MAX_ALIAS_VALUES:
            self._refuse(f"aliases expand to more than {MAX_ALIAS_VALUES} values (alias-bomb limit)", event.start_mark)
        return super().compose_node(parent, index)  # undefined aliases: yaml's own error

    def _refuse(self, problem: str, mark: Any) -> NoReturn:
        where = "".join(self._where[:_SHOWN_PATH_PARTS]).lstrip(".")
        if len(self._where) > _SHOWN_PATH_PARTS:
            where += "..."
        raise _LimitError(problem=f"{problem} @ {where or 'top level'}", problem_mark=mark)


def _label(parent: yaml.Node | None, index: Any) -> str:
    if isinstance(parent, yaml.SequenceNode):
        return f"[{index}]"
    if isinstance(parent, yaml.MappingNode):
        return f".{index.value}" if isinstance(index, yaml.ScalarNode) else ".<key>"
    return ""


def _shape(node: yaml.Node, shapes: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(height, size) of a finished collection ``node`` with every alias written out."""
    children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
    height, size = 0, 1
    for child in children:
        child_height, child_size = shapes.get(id(child), (0, 1))  # a scalar: (0, 1)
        height = max(height, child_height)
        size += child_size
    return height + 1, size


def safe_load(text: str, *, depth: int = 0, where: Sequence[str] = ()) -> Any:
    """``yaml.safe_load`` within :data:`MAX_NESTING` and :data:`MAX_ALIAS_VALUES`.

    ``depth`` is the number of collections the text's value will sit in
    (for an override's value), ``where`` the key path labels to it
    (``["requests", "[0]", ".model"]``), for messages. Raises ``yaml.YAMLError``.
    """
    loader = _BoundedLoader(text, depth, where)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def check_nesting(data: Any, where: str = "") -> None:
    """Raise :class:`ConfigError` if ``data`` (parsed already, e.g. from JSON or
    given by the SDK) nests deeper than :data:`MAX_NESTING`, naming the path to a
    too-deep value. Shared and recursive containers are walked once per level,
    so this is linear in the distinct containers, never their expansion."""
    # Breadth first, one level at a time; an entry is (container, its parent entry, key).
    level: list[tuple[Any, Any, str]] = [(data, None, where)] if isinstance(data, (dict, list)) else []
    for _ in range(MAX_NESTING):
        seen: set[int] = set()
        deeper: list[tuple[Any, Any, str]] = []
        for entry in level:
            container = entry[0]
            items = container.items() if isinstance(container, dict) else enumerate(container)
            for key, value in items:
                if isinstance(value, (dict, list)) and id(value) not in seen:
                    seen.add(id(value))
                    deeper.append((value, entry, f"[{key}]" if isinstance(container, list) else f".{key}"))
        level = deeper
    if level:
        parts: list[str] = []
        entry = level[0]
        while entry is not None:
            parts.append(entry[2])
            entry = entry[1]
        parts.reverse()
        shown = "".join(parts[:_SHOWN_PATH_PARTS]).lstrip(".") + ("..." if len(parts) > _SHOWN_PATH_PARTS else "")
        raise ConfigError(f"config nested deeper than {MAX_NESTING} levels @ {shown or 'top level'}")


def yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or one_line(exc)
    if mark is None:
        return f": {problem}"
    return f" line {mark.line + 1}: {problem}"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
