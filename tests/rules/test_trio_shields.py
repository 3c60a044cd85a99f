"""No unbounded shield (STYLE: cleanup is bounded by the one grace deadline):
every ``shield=True`` in the package and the plugins comes with a deadline,
as ``move_on_at`` / ``move_on_after`` / ``fail_at`` / ``fail_after`` or a
``CancelScope(deadline=...)``, and no code turns a scope's shield on later."""

from __future__ import annotations

import ast
from pathlib import Path

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
BOUNDED = {"move_on_at", "move_on_after", "fail_at", "fail_after"}


def _sources() -> list[Path]:
    files = sorted((REPO / "agentcompass").rglob("*.py"))
    files += sorted(p for p in (REPO / "plugins").rglob("*.py") if "tests" not in p.relative_to(REPO / "plugins").parts)
    return files


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def unbounded_shields(source: str, where: str) -> list[str]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            keywords = {k.arg: k.value for k in node.keywords}
            shield = keywords.get("shield")
            if not (isinstance(shield, ast.Constant) and shield.value is True):
                continue
            name = _name(node.func)
            if name in BOUNDED or (name == "CancelScope" and "deadline" in keywords):
                continue
            found.append((node.lineno, f"{name}(shield=True) without a deadline"))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr == "shield":
                    if isinstance(node.value, ast.Constant) and node.value.value is True:
                        found.append((node.lineno, ".shield = True"))
    return [f"{where}:{line}: {what}" for line, what in sorted(found)]


def test_every_shield_in_the_package_and_plugins_has_a_deadline() -> None:
    files = _sources()
    assert any(p.name == "_run_store.py" for p in files) and any("agentcompass_sandbox" in p.parts for p in files)
    found = [line for path in files for line in unbounded_shields(path.read_text(), str(path.relative_to(REPO)))]
    assert found == []


def test_the_check_finds_an_unbounded_shield() -> None:
    bad = "with trio.CancelScope(shield=True):\n    pass\nscope.shield = True\n"
    good = (
        "with trio.move_on_at(t, shield=True):\n    pass\n"
        "with trio.CancelScope(shield=True, deadline=t):\n    pass\n"
        "scope.shield = False\n"
    )
    assert unbounded_shields(bad, "x.py") == [
        "x.py:1: CancelScope(shield=True) without a deadline",
        "x.py:3: .shield = True",
    ]
    assert unbounded_shields(good, "x.py") == []
