"""The test tree's layout (docs/tests.md): each folder of ``tests/`` is named
for a part of the package or one of the named cross-cutting suites; module
base names are unique over every test directory (pytest imports each file by
its base name); no folder passes for a module the code imports."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
PACKAGE = REPO / "agentcompass"
TEST_DIRS = (REPO / "tests", *sorted((REPO / "plugins").glob("*/tests")))
#: Suites that check the whole system rather than one part of the package.
SUITES = {"end_to_end", "faults", "reuse", "perf", "docs", "rules"}
#: ``_ray``'s tests: a folder named ``ray`` on ``sys.path`` would pass for the Ray distribution.
RENAMED = {"ray_executor": "_ray"}


def _folders() -> list[str]:
    return sorted(p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name != "__pycache__")


def test_every_folder_of_tests_names_a_part_of_the_package_or_a_named_suite():
    parts = {p.name.lstrip("_") for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem.lstrip("_") for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert parts and modules
    unknown = [name for name in _folders() if name not in parts | modules | SUITES and name not in RENAMED]
    assert unknown == [], f"name these after the package part they test, or add them to docs/tests.md: {unknown}"
    assert all((PACKAGE / package).is_dir() for package in RENAMED.values())


def test_module_base_names_are_unique_over_every_test_directory():
    seen: dict[str, list[str]] = defaultdict(list)
    for root in TEST_DIRS:
        for path in root.rglob("*.py"):
            if path.name not in ("conftest.py", "__init__.py") and "__pycache__" not in path.parts:
                seen[path.stem].append(str(path.relative_to(REPO)))
    assert len(seen) > 100
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_folder_of_tests_passes_for_a_module_the_code_imports():
    imported: set[str] = set()
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "plugins").glob("*/agentcompass_*/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    assert {"trio", "ray"} <= imported
    assert sorted(set(_folders()) & imported) == []
