"""No two modules of the package or of a plugin import each other, at module
level, inside a function or under ``TYPE_CHECKING``: a reader can follow
every import downward, and a split module cannot come back as a circle."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Circles known and owned elsewhere, to be removed from here once gone.


def _modules() -> dict[str, Path]:
    """Every module of ``agentcompass`` and of each plugin's package, by dotted name."""
    roots = [(REPO, REPO / "agentcompass")]
    roots += [(plugin, package) for plugin in (REPO / "plugins").iterdir() for package in plugin.glob("agentcompass_*")]
    found = {}
    for root, package in roots:
        for path in package.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The known modules ``name`` imports (a ``from`` name that is a module counts as that module)."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in modules else base)
    edges = set()
    for target in targets:
        parts = target.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        if parts and ".".join(parts) != name:
            edges.add(".".join(parts))
    return edges


def test_no_two_modules_import_each_other() -> None:
    modules = _modules()
    assert "agentcompass._orchestration._request" in modules and "agentcompass_remote._session" in modules
    edges = {name: _imported(name, path, modules) for name, path in modules.items()}
    circles = {frozenset({a, b}) for a, out in edges.items() for b in out if a in edges.get(b, set())}
    assert circles == set(), sorted(sorted(pair) for pair in circles)
