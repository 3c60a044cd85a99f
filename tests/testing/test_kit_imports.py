"""agentcompass.testing is a public surface plugin authors build on: it reaches
only public names of the package, so a private module can change under it."""

from __future__ import annotations

import ast
from pathlib import Path

import agentcompass.testing

KIT = Path(agentcompass.testing.__file__).parent

#: Private modules the kit still reaches, by the kit module that does: the
#: scripted model server and the gateway checks serve HTTP the way the
#: gateway does and speak its wire formats; ``__init__`` publishes its names
#: the way every public module does.
SHARED_WITH_THE_MODEL_PATH = ("agentcompass._asgi", "agentcompass._models", "agentcompass._gateway")
ALLOWED = {
    "__init__.py": ("agentcompass.runtime._public",),
    # The scripted model server and its parts speak the wire the client and the gateway speak.
    **dict.fromkeys(
        (
            "model_server.py",
            "_replies.py",
            "_scripts.py",
            "_chat_stream.py",
            "_responses_render.py",
            "_messages_render.py",
            "_gemini_render.py",
        ),
        SHARED_WITH_THE_MODEL_PATH,
    ),
    "_gateway_checks.py": SHARED_WITH_THE_MODEL_PATH,
    "_gateway_load.py": SHARED_WITH_THE_MODEL_PATH,
}


def _private_reaches(path: Path) -> set[str]:
    """The package's private modules ``path`` (a module of the kit) imports,
    lazy imports included; its own package's modules are its own."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level != 1:
            base = "agentcompass" if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names = [module] + [f"{module}.{a.name}" for a in node.names if a.name.startswith("_")]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "agentcompass" and any(p.startswith("_") for p in parts[1:]):
                found.add(name)
    return found


def test_the_walk_sees_private_reaches_relative_absolute_and_lazy(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from .._store._disk import Disk\nfrom ._calls import Call\nfrom agentcompass.agents import AgentRun\n"
        "def f():\n    from .._models import _gemini_wire\n    import agentcompass.harnesses._agent_table\n"
    )
    assert _private_reaches(module) == {
        "agentcompass._store._disk",
        "agentcompass._models",
        "agentcompass._models._gemini_wire",
        "agentcompass.harnesses._agent_table",
    }


def test_the_kit_imports_only_public_names_of_the_package() -> None:
    # The store's disk seam is private (no public API takes a disk): its fake
    # lives beside it in the store; the noop agent is written on agentcompass.agents.
    reaches = {
        f"{path.name}: {name}"
        for path in sorted(KIT.glob("*.py"))
        for name in _private_reaches(path)
        if not any(name == a or name.startswith(a + ".") for a in ALLOWED.get(path.name, ()))
    }
    assert reaches == set()
