"""The dependency floors the distributions declare (``setup.cfg`` of the
package and of each plugin): every requirement is ``name>=version``.

``python tests/rules/floors.py`` prints them as exact pins (``name==version``), the
constraints ``make test-floors`` installs into a venv of its own to run a
focused subset of the tests on the oldest versions the floors allow.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The distributions' setup.cfg files: the package's first, then the plugins'.
SETUP_FILES = (ROOT / "setup.cfg", *sorted((ROOT / "plugins").glob("*/setup.cfg")))
#: Extras whose floors are checked too (lint tools are not run on the floors).
EXTRAS = ("test",)
#: The package's own distributions: required by the plugins, never pinned.
OWN = {"agentcompass", "agentcompass-remote", "agentcompass-sandbox"}

_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<spec>.*)$")
_FLOOR = re.compile(r"^>=\s*(?P<version>[0-9][0-9A-Za-z.]*)$")


def requirements(path: Path) -> list[str]:
    """The ``install_requires`` and :data:`EXTRAS` lines of one setup.cfg."""
    parser = configparser.ConfigParser()
    parser.read(path, encoding="utf-8")
    lines = parser.get("options", "install_requires", fallback="").splitlines()
    for extra in EXTRAS:
        lines += parser.get("options.extras_require", extra, fallback="").splitlines()
    return [line.strip() for line in lines if line.strip()]


def floors() -> dict[str, str]:
    """``{distribution: floor}`` over every setup.cfg; ValueError for a
    requirement without a plain ``>=`` floor, or two different floors of one
    distribution."""
    found: dict[str, str] = {}
    for path in SETUP_FILES:
        for line in requirements(path):
            match = _REQUIREMENT.match(line)
            if match is None:
                raise ValueError(f"{path.relative_to(ROOT)}: cannot read requirement {line!r}")
            name = match["name"].lower().replace("_", "-")
            if name in OWN:
                continue
            floor = _FLOOR.match(match["spec"])
            if floor is None:
                raise ValueError(f"{path.relative_to(ROOT)}: {line!r} needs a floor, written {name}>=X.Y")
            if found.setdefault(name, floor["version"]) != floor["version"]:
                raise ValueError(f"{path.relative_to(ROOT)}: {name} floor {floor['version']} != {found[name]} elsewhere")
    return found


if __name__ == "__main__":
    print("\n".join(f"{name}=={version}" for name, version in sorted(floors().items())))
