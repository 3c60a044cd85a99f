"""The code's shape, as a reviewer checks it with grep and the import graph:
each seam crossed through its public side (no ``_orchestration`` import
under ``_ray/``, no private ``httpx`` name) and no module over
:data:`MAX_LINES` lines but a genuine core docs/plugins.md names (no two
modules importing each other is ``test_import_circles.py``)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = [REPO / "agentcompass", *sorted(REPO.glob("plugins/*/agentcompass_*"))]
MAX_LINES = 450


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(package.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


MODULES = dict(_modules())


def _imports(name: str, path: Path) -> set[str]:
    """Every module of the tree ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


def test_no_module_is_over_the_limit_but_a_named_core() -> None:
    architecture = (REPO / "docs" / "plugins.md").read_text()
    over = {
        str(path.relative_to(REPO)): lines
        for path in MODULES.values()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    unnamed = {path: lines for path, lines in over.items() if f"`{path}`" not in architecture}
    assert unnamed == {}


def test_each_seam_is_crossed_only_through_its_public_side() -> None:
    private_httpx = re.compile(r"^\s*(from|import)\s+httpx\._", re.M)
    assert [n for n, p in MODULES.items() if private_httpx.search(p.read_text())] == []
    ray = {n: _imports(n, p) for n, p in MODULES.items() if n.startswith("agentcompass._ray")}
    assert {
        n: sorted(t for t in targets if t.startswith("agentcompass._orchestration")) for n, targets in ray.items()
    } == {n: [] for n in ray}
