"""Run ids and tags: names that sort by time and that two runs never share."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime

__all__ = ["RUN_ID_PATTERN", "check_name", "new_run_id", "new_run_tag"]


def new_run_id() -> str:
    """A fresh run id, e.g. ``20261129T233501.482Z-a7f3``: UTC time to the
    millisecond (the greatest id is the latest run) and a random suffix (two
    runs never share a directory)."""
    now = datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{secrets.token_hex(2)}"


def new_run_tag() -> str:
    """A fresh run tag, e.g. ``ac3f9a1c2b7d``: the prefix of every Environment
    session name of one run, recorded in its ``run_info.json`` so that
    ``sweep(tag)`` finds what a killed run left. Fixed length, so that no
    run's tag is a prefix of another's."""
    return f"ac{secrets.token_hex(5)}"


#: What :func:`new_run_id` makes (and the older second-resolution form).
RUN_ID_PATTERN = re.compile(r"\d{8}T\d{6}(\.\d{3})?Z(-[0-9a-f]+)?")


def check_name(name: str, what: str) -> None:
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(f"{what} {name!r} cannot be used as a directory name")
