"""The ``sandbox`` provider: build_config, preflight, open, reap and sweep."""

from __future__ import annotations

import math
import os
import secrets
import shutil
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import trio

from agentcompass import (
    BaseEnvironment,
    ComponentError,
    ExecutionPlan,
    Issue,
    IssueError,
    NetworkPolicy,
    netpolicy,
    register,
)
from agentcompass.runtime import cleanup_deadline

from . import _host, _pool
from ._images import ImageMaker, RootCache, default_cache
from ._rootfs import ImageFormatError, resolve_user
from ._session import SandboxSession, fail

#: Host programs the provider runs.
REQUIRED_PROGRAMS = ("bwrap", "nsenter", "nft")


def host_problem(
    memory_mb: int | None = None,
    pids_max: int | None = None,
    cpus: float | None = None,
    *,
    euid: Callable[[], int] = os.geteuid,
    which: Callable[[str], str | None] = shutil.which,
) -> str | None:
    """Why this host cannot run sandboxes (one line), or ``None`` when it can.
    Blocking but quick: a uid check, ``PATH`` look-ups and ``/proc`` reads.
    ``euid`` and ``which`` are seams for hosts other than this one."""
    if euid() != 0:
        return "the sandbox provider needs root (to create network namespaces, veths and cgroups)"
    missing = [p for p in REQUIRED_PROGRAMS if which(p) is None]
    if missing:
        return (
            f"the sandbox provider needs {', '.join(missing)} on PATH (apt-get install bubblewrap nftables util-linux)"
        )
    bases = _host.cgroup_bases()
    if "track" not in bases:
        return "the sandbox provider needs a cgroup v2 hierarchy mounted (to kill process trees)"
    if memory_mb is not None and "memory" not in bases:
        return "sandbox memory_mb is set but this host has no memory cgroup controller"
    if pids_max is not None and "pids" not in bases:
        return "sandbox pids_max is set but this host has no pids cgroup controller"
    if cpus is not None and "cpu" not in bases:
        return "sandbox cpus is set but this host has no cpu cgroup controller"
    return None


def _default_docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


@attrs.frozen
class ImagePlan:
    """What :meth:`SandboxEnvironment.open` gets for a plan with an image."""

    options: Any  # SandboxEnvironment.Config
    task_id: str
    image: str | None
    build_context: str | None
    build_timeout_seconds: float | None
    workdir: str | None
    user: str | None


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value <= 0):
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


@register
class SandboxEnvironment(BaseEnvironment):
    """Provider ``sandbox``: namespaces + bubblewrap, policies switchable live.

    Config: ``memory_mb`` and ``pids_max`` (cgroup limits of the whole
    session; none by default), ``max_output_bytes`` (per stream of one
    ``exec``; 1 MiB), ``reuse_network_namespaces`` (give a session's
    network namespace back to the pool at close; true), ``tmpfs_mb`` (the size
    of each of a session's two tmpfs, ``/tmp`` and the one holding ``/app``,
    ``/tests``, ``/logs`` and ``/solution``; 1024: without a size a session
    could fill half the host's memory in each; over an image, the size of
    its upper layer, which every write of the session fills). ``images``
    (true: the feature ``images``), ``image_cache`` (where image roots are
    kept), ``docker_host`` (the Docker-compatible daemon that builds and
    pulls; ``DOCKER_HOST``, else ``unix:///var/run/docker.sock``) and
    ``pull`` (``missing``: ``always``, ``missing``, ``never``) and
    ``pull_from`` (``daemon``, or ``registry``: no daemon at all) and
    ``image_source`` (for a task that names an image and ships a build
    context: ``prebuilt`` the image, ``build`` the context,
    ``prebuilt_else_build`` the context when the image cannot be had, with
    one WARNING ``image_built_instead`` per request; ``prebuilt``): see the
    section on images in ``docs/sandbox.md``. Needs root, ``bwrap``, ``nsenter`` and ``nft``; :meth:`preflight` says which is missing. See ``docs/sandbox.md``.
    """

    id: ClassVar[str] = "sandbox"
    #: The plan's ``SandboxSpec``: ``memory_mb`` and ``cpus`` are cgroup limits
    #: of the session, ``storage_mb`` the size of each tmpfs, ``env`` goes to
    #: every command; the host's userland serves every task (no ``images``),
    #: and commands run as the sandbox user (no ``root``).
    features: ClassVar[frozenset[str]] = frozenset({"literal_paths", "limits"})
    #: With ``images`` (the default): a task's image is built or pulled and
    #: unpacked once, and its sessions run over it, as root inside where the
    #: image says so (``root``).
    image_features: ClassVar[frozenset[str]] = frozenset({"images", "literal_paths", "root", "limits"})

    @attrs.frozen
    class Config:
        memory_mb: int | None = attrs.field(
            default=None, validator=_positive, metadata={"doc": "memory limit of the whole session (cgroup)"}
        )
        pids_max: int | None = attrs.field(
            default=None, validator=_positive, metadata={"doc": "process limit of the whole session (cgroup)"}
        )
        max_output_bytes: int = attrs.field(
            default=1048576,
            validator=attrs.validators.gt(0),
            metadata={"doc": "exec output kept per stream (the tail, with a marker)"},
        )
        reuse_network_namespaces: bool = attrs.field(
            default=True, metadata={"doc": "give a session's network namespace back to the pool at close"}
        )
        cpus: float | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(attrs.validators.gt(0)),
            metadata={"doc": "CPU limit of the whole session (cgroup), in CPUs"},
        )
        env: dict[str, str] = attrs.field(factory=dict, metadata={"doc": "variables every command of a session gets"})
        tmpfs_mb: int = attrs.field(
            default=1024,
            validator=_positive,
            metadata={"doc": "size of each of the session's two tmpfs (/tmp; /app, /tests, /logs, /solution)"},
        )
        images: bool = attrs.field(default=True, metadata={"doc": "run tasks that name an image over that image"})
        image_cache: str = attrs.field(factory=default_cache, metadata={"doc": "where unpacked image roots are kept"})
        docker_host: str = attrs.field(
            factory=_default_docker_host, metadata={"doc": "the Docker-compatible daemon that builds and pulls images"}
        )
        pull: str = attrs.field(
            default="missing",
            validator=attrs.validators.in_(("always", "missing", "never")),
            metadata={"doc": "when to pull a named image: always, missing, never"},
        )
        pull_from: str = attrs.field(
            default="daemon",
            validator=attrs.validators.in_(("daemon", "registry")),
            metadata={"doc": "who pulls a named image: the daemon at docker_host, or the registry client (no daemon)"},
        )
        image_source: str = attrs.field(
            default="prebuilt",
            validator=attrs.validators.in_(("prebuilt", "build", "prebuilt_else_build")),
            metadata={
                "doc": "a task with an image and a build context: prebuilt (the image), build (the context), "
                "prebuilt_else_build (build when the image cannot be had, one WARNING image_built_instead)"
            },
        )

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        if self.options.images:
            self.features = self.image_features  # type: ignore[misc]
        self._maker: ImageMaker | None = None
        self._built_instead = False  # the WARNING image_built_instead is said once per provider (per request)

    @property
    def images(self) -> ImageMaker:
        """Where this provider's image roots come from (``cache.unpacks`` and ``builds`` count its work)."""
        if self._maker is None:
            cache = RootCache(os.path.expanduser(self.options.image_cache))
            self._maker = ImageMaker(cache, self.options.docker_host, self.options.pull, self.options.pull_from)
        return self._maker

    def host_euid(self) -> int:
        """The uid :meth:`preflight` checks (a seam: override to model another host)."""
        return os.geteuid()

    def find_program(self, program: str) -> str | None:
        """Where :meth:`preflight` finds a host program (a seam, as ``host_euid``)."""
        return shutil.which(program)

    def resolve_host(self, host: str) -> list[str]:
        """The addresses an allowlisted ``host`` is allowed at (blocking;
        ``getaddrinfo`` on the host; a seam, as ``host_euid``)."""
        return netpolicy.lookup(host)

    def preflight(self) -> None:
        """Raise :class:`ComponentError` (one line) when this host cannot run sandboxes."""
        problem = host_problem(
            self.options.memory_mb,
            self.options.pids_max,
            self.options.cpus,
            euid=self.host_euid,
            which=self.find_program,
        )
        if problem is not None:
            raise ComponentError(problem)

    def build_config(self, plan: ExecutionPlan) -> Any:
        """Accept every plan whose policies are ``none``, ``allowlist`` with
        well-formed ``host[:port]`` entries, or ``full``; reject anything else."""
        for phase, policy in (
            ("baseline", plan.baseline_network_policy),
            ("run", plan.run_network_policy),
            ("evaluation", plan.evaluation_network_policy),
        ):
            netpolicy.check(policy, "sandbox", f"{phase} network policy of task {plan.task_id!r}")
        spec = plan.sandbox
        limits = {
            "memory_mb": spec.memory_mb,
            "cpus": spec.cpus,
            "tmpfs_mb": spec.storage_mb,
            "env": dict(spec.env) or None,
        }
        changes = {key: value for key, value in limits.items() if value is not None}
        options = attrs.evolve(self.options, **changes) if changes else self.options
        if self.options.images and (spec.image is not None or spec.build_context is not None):
            if spec.workdir is not None and not spec.workdir.startswith("/"):
                raise ComponentError(f"task {plan.task_id!r}: workdir {spec.workdir!r} is not an absolute path")
            context = os.fspath(spec.build_context) if spec.build_context is not None else None
            return ImagePlan(
                options, plan.task_id, spec.image, context, spec.build_timeout_seconds, spec.workdir, spec.user
            )
        if spec.workdir not in (None, "/app"):
            raise ComponentError(
                f"task {plan.task_id!r}: the sandbox provider starts commands in /app, not {spec.workdir!r}"
            )
        if spec.user is not None:
            raise ComponentError(
                f"task {plan.task_id!r}: the sandbox provider runs commands as its own user, not {spec.user!r}"
            )
        if "root" in plan.benchmark_plan.get("required_features", ()):
            raise ComponentError(f"task {plan.task_id!r}: without an image, no sandbox command runs as root")
        return options

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> SandboxSession:
        """Create the sandbox under ``policy`` and return its session. ``name``
        labels every resource (a random ``sandbox-...`` name when ``None``).
        A failure or cancellation removes whatever was made before propagating."""
        options = self.options if config is None else config
        image_plan = options if isinstance(options, ImagePlan) else None
        if image_plan is not None:
            options = image_plan.options
        if isinstance(options, dict):
            options = type(self)(options).options
        if name is None:
            name = "sandbox-" + secrets.token_hex(6)
        if not _host.NAME_RE.fullmatch(name):
            raise fail(f"sandbox name {name!r} must match [a-z0-9-]{{1,40}}")
        try:
            netpolicy.check(policy, "sandbox", "network policy")
        except ComponentError as exc:
            raise fail(str(exc)) from None
        image = user = None
        issues: tuple[Issue, ...] = ()
        if image_plan is not None:
            image, user, issues = await self._image_root(image_plan)
        # Every session borrows a network namespace made ahead (see _pool):
        # with a veth when it starts with egress, with loopback only under none.
        pool = _pool.current(veth=policy.mode != "none")
        session = SandboxSession(
            name,
            options.max_output_bytes,
            options.memory_mb,
            options.pids_max,
            lookup=self.resolve_host,
            pool=pool,
            recycle=options.reuse_network_namespaces,
            tmpfs_mb=options.tmpfs_mb,
            cpus=options.cpus,
            env=options.env,
            image=image,
            user=user,
            workdir=None if image_plan is None else image_plan.workdir,
        )
        session.open_issues = issues
        try:
            await session.start(policy)
        except BaseException:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await session.close()
            raise
        return session

    async def _image_root(self, plan: ImagePlan) -> tuple[Any, tuple[int, int] | None, tuple[Issue, ...]]:
        """The image's root (made once, see :mod:`._images`; chosen per
        ``image_source``), the plan's user in it and the open's WARNING
        ``image_built_instead``; FATAL ``setup_timeout`` past ``build_timeout_seconds``."""
        bound = plan.build_timeout_seconds
        with trio.move_on_after(math.inf if bound is None else bound):
            source = self.options.image_source
            root, reason = await self.images.task_root(plan.task_id, plan.image, plan.build_context, source)
            issues: tuple[Issue, ...] = ()
            if reason is not None and not self._built_instead:
                self._built_instead = True
                message = f"{reason}; built the task's build context instead (image_source prebuilt_else_build)"
                issues = (Issue("warning", "setup", "image_built_instead", message),)
            if plan.user is None:
                return root, None, issues
            try:
                return root, await trio.to_thread.run_sync(resolve_user, root.rootfs, plan.user), issues
            except ImageFormatError as exc:
                raise IssueError("fatal", "environment_failed", f"task {plan.task_id!r}: {exc}") from None
        what = plan.image or plan.build_context
        raise IssueError("fatal", "setup_timeout", f"preparing the image of {what} took over {bound}s", phase="setup")

    async def reap(self, handle: dict[str, Any]) -> None:
        """Destroy the sandbox named by ``handle`` (idempotent)."""
        name = handle.get("name") if isinstance(handle, dict) else None
        if not isinstance(name, str) or not _host.NAME_RE.fullmatch(name):
            raise IssueError("warning", "cleanup_failed", f"not a sandbox handle: {handle!r}")
        await trio.to_thread.run_sync(_host.destroy, name)

    async def sweep(self, tag: str) -> None:
        """Destroy every sandbox whose name starts with ``tag`` (idempotent)."""
        if not tag:
            raise ValueError("sweep needs a non-empty tag")

        def sweep_all() -> None:
            for name in sorted(_host.names_with_prefix(tag)):
                _host.destroy(name)
            _pool.reclaim_stale_leases()  # a killed runtime's pool

        await trio.to_thread.run_sync(sweep_all)
