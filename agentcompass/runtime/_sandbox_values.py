"""What a task needs of its sandbox: the network policy of each phase
(:class:`NetworkPolicy`, the user's :class:`NetworkOverrides`) and the
:class:`SandboxSpec`; values like the rest of ``_values``, which re-exports them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs

__all__ = ["FULL_NETWORK", "NetworkOverrides", "NetworkPolicy", "SandboxSpec"]


@attrs.frozen
class NetworkPolicy:
    """Network access of a phase: ``none``, an ``allowlist`` of hosts, or ``full``."""

    mode: Literal["none", "allowlist", "full"] = "full"
    allow: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: Any, where: str = "network policy") -> NetworkPolicy:
        """A policy from a plan or config value: a ``NetworkPolicy``, a mode
        string, or ``{"mode": ..., "allow": [...]}``. Raises ``ValueError``
        naming ``where`` and the offending value."""
        if isinstance(value, NetworkPolicy):
            return value
        if isinstance(value, str):
            value = {"mode": value}
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping with 'mode' (and 'allow'), got {value!r}")
        extra = set(value) - {"mode", "allow"}
        if extra:
            raise ValueError(f"{where}: unknown key {min(extra)!r}")
        mode = value.get("mode", "full")
        if mode not in ("none", "allowlist", "full"):
            raise ValueError(f"{where}: mode must be one of none, allowlist, full, got {mode!r}")
        allow = value.get("allow", ())
        if isinstance(allow, str) or not all(isinstance(host, str) for host in allow):
            raise ValueError(f"{where}: allow must be a list of host names")
        return cls(mode, tuple(allow))

    def is_within(self, other: NetworkPolicy) -> bool:
        """True when this policy grants no access that ``other`` does not."""
        if other.mode == "full" or self.mode == "none":
            return True
        if self.mode == "allowlist" and other.mode == "allowlist":
            return set(self.allow) <= set(other.allow)
        return False


FULL_NETWORK = NetworkPolicy("full")


@attrs.frozen
class NetworkOverrides:
    """The user's network policy per phase (``None`` leaves the phase to the
    benchmark and recipes). Applied last by the planner, so ``run: none``
    holds on any benchmark; a provider that cannot enforce it rejects the plan."""

    baseline: NetworkPolicy | None = attrs.field(
        default=None, metadata={"doc": "policy while the sandbox is set up: none, allowlist or full (null: the plan's)"}
    )
    run: NetworkPolicy | None = attrs.field(
        default=None, metadata={"doc": "policy while the agent runs (null: the plan's)"}
    )
    evaluation: NetworkPolicy | None = attrs.field(
        default=None, metadata={"doc": "policy while the evaluation runs (null: the plan's)"}
    )


@attrs.frozen
class SandboxSpec:
    """What a task needs from its sandbox (SPEC section 3).

    A benchmark fills it from the task (``terminal``: ``task.toml`` and
    ``environment/``); the user's ``execution.sandbox`` overrides it field by
    field (a field left ``None``, or an empty ``env``, keeps the task's). A
    provider honours what its ``features`` cover and rejects a plan asking
    for more (FATAL ``environment_unsupported``, or ``image_required`` for an
    image), never running it somewhere else silently.

    ``image`` is used as given (pulled); otherwise ``build_context`` (a
    directory holding a ``Dockerfile``) is built. ``workdir`` is where
    commands start, ``env`` is added to every command's environment,
    ``user`` is who they run as (``root`` needs the ``root`` feature);
    ``cpus``, ``memory_mb`` and ``storage_mb`` need ``limits``.
    """

    image: str | None = attrs.field(default=None, metadata={"doc": "an image to run the task in, pulled as given"})
    build_context: Path | None = attrs.field(
        default=None, metadata={"doc": "a directory with a Dockerfile, built when no image is named"}
    )
    build_timeout_seconds: float | None = attrs.field(
        default=None, metadata={"doc": "bound on building or pulling the image (FATAL setup_timeout)"}
    )
    workdir: str | None = attrs.field(default=None, metadata={"doc": "where commands start (null: the image's)"})
    env: dict[str, str] = attrs.field(factory=dict, metadata={"doc": "variables every command in the session gets"})
    cpus: float | None = attrs.field(default=None, metadata={"doc": "CPU limit (needs the limits feature)"})
    memory_mb: int | None = attrs.field(default=None, metadata={"doc": "memory limit in MiB (needs limits)"})
    storage_mb: int | None = attrs.field(default=None, metadata={"doc": "disk limit in MiB (needs limits)"})
    user: str | None = attrs.field(default=None, metadata={"doc": "who commands run as (null: the provider's)"})

    def features(self) -> frozenset[str]:
        """The provider features this spec needs (see ``BaseEnvironment.features``)."""
        needed = set()
        if self.image is not None or self.build_context is not None:
            needed.add("images")
        if self.cpus is not None or self.memory_mb is not None or self.storage_mb is not None:
            needed.add("limits")
        if self.user == "root":
            needed.add("root")
        return frozenset(needed)

    def overridden_by(self, user: SandboxSpec) -> SandboxSpec:
        """This spec with every field the user set (not ``None``, a non-empty
        ``env`` merged over the task's) taking precedence."""
        changes: dict[str, Any] = {
            field.name: getattr(user, field.name)
            for field in attrs.fields(SandboxSpec)
            if field.name != "env" and getattr(user, field.name) is not None
        }
        if user.env:
            changes["env"] = {**self.env, **user.env}
        return attrs.evolve(self, **changes) if changes else self
