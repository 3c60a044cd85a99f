"""The ``docker`` provider: build_config, preflight, open, reap and sweep."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import attrs
import httpx
import structlog
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

from . import _expose
from ._api import Engine, EngineError, socket_path
from ._container import ContainerSpec, remove
from ._images import ImageCache
from ._session import SESSION_LABEL, DockerSession, fail

log = structlog.get_logger("agentcompass_docker")

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
_PULL = ("always", "missing", "never")
_IMAGE_SOURCES = ("prebuilt", "build", "prebuilt_else_build")


def _default_host() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


@attrs.frozen
class OpenConfig:
    """What :meth:`DockerEnvironment.open` gets from :meth:`~DockerEnvironment.build_config`."""

    task_id: str
    image: str | None
    build_context: str | None
    build_timeout_seconds: float | None
    container: ContainerSpec


@attrs.frozen
class ImageReport:
    """The image a session runs and what getting it produced for the attempt."""

    image: str
    issues: tuple[Issue, ...] = ()
    logs: dict[str, bytes] = attrs.field(factory=dict)
    timings: dict[str, float] = attrs.field(factory=dict)


@register
class DockerEnvironment(BaseEnvironment):
    """Provider ``docker``: one container per session through the Docker Engine API.

    Config: ``host`` (the daemon's unix socket; ``DOCKER_HOST``, else
    ``unix:///var/run/docker.sock``), ``default_image`` (for a task that
    names no image and ships no build context), ``pull`` (``always``,
    ``missing`` or ``never``; ``missing``), ``image_source`` (for a task
    that names an image and ships a Dockerfile: ``prebuilt`` pulls the
    image, ``build`` builds the Dockerfile, ``prebuilt_else_build`` builds
    when the pull fails, with one WARNING ``image_built_instead`` per
    request; ``prebuilt``), ``cpus``, ``memory_mb`` and
    ``pids_max`` (limits for tasks that set none), ``max_output_bytes`` (per
    stream of one ``exec``; 1 MiB). The plan's ``SandboxSpec`` gives the
    image or build context, ``workdir``, ``env``, ``user`` and limits. One
    HTTP client per provider instance, closed by :meth:`aclose` (the runtime
    drops the instance with the request; the client's connections go with
    it). See ``docs/docker.md``.
    """

    id: ClassVar[str] = "docker"
    features: ClassVar[frozenset[str]] = frozenset({"images", "literal_paths", "root", "limits"})

    @attrs.frozen
    class Config:
        host: str = attrs.field(factory=_default_host, metadata={"doc": "the daemon's unix socket (unix:///...)"})
        default_image: str | None = attrs.field(default=None, metadata={"doc": "image of tasks that name none"})
        pull: str = attrs.field(
            default="missing",
            validator=attrs.validators.in_(_PULL),
            metadata={"doc": "when to pull a named image: always, missing, never"},
        )
        image_source: str = attrs.field(
            default="prebuilt",
            validator=attrs.validators.in_(_IMAGE_SOURCES),
            metadata={
                "doc": "a task with an image and a Dockerfile: prebuilt (pull the image), build (the Dockerfile), "
                "prebuilt_else_build (build when the pull fails, one WARNING image_built_instead)"
            },
        )
        cpus: float | None = attrs.field(default=None, validator=_positive, metadata={"doc": "default CPU limit"})
        memory_mb: int | None = attrs.field(
            default=None, validator=_positive, metadata={"doc": "default memory limit in MiB"}
        )
        pids_max: int | None = attrs.field(
            default=None, validator=_positive, metadata={"doc": "process limit of each container"}
        )
        storage: str = attrs.field(
            default="if_supported",
            validator=attrs.validators.in_(("if_supported", "required")),
            metadata={
                "doc": "a task's storage_mb on a daemon that cannot limit storage (overlay2 on ext4): "
                "if_supported runs it unlimited with one WARNING, required fails it environment_unsupported"
            },
        )
        max_output_bytes: int = attrs.field(
            default=1048576,
            validator=attrs.validators.gt(0),
            metadata={"doc": "exec output kept per stream (the tail, with a marker)"},
        )

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self._engine: Engine | None = None
        self._images: ImageCache | None = None
        # Whether sessions get a directory for expose_directory (see _expose).
        self._exposing = self.host_euid() == 0
        # Whether the daemon may limit a container's storage (False once it said it cannot).
        self._storage = True
        self._private_warned = False
        # Whether this request was told once that an image was built instead of pulled.
        self._built_instead = False

    @property
    def engine(self) -> Engine:
        """The provider's one client (made on first use, in the Trio run that uses it)."""
        if self._engine is None:
            self._engine = Engine(self.options.host)
            self._images = ImageCache(self._engine)
        return self._engine

    @property
    def images(self) -> ImageCache:
        """The images this provider made sure of (``builds`` and ``pulls`` count what it started)."""
        self.engine  # noqa: B018 - makes both
        assert self._images is not None
        return self._images

    async def aclose(self) -> None:
        """Close the HTTP client (its pooled connections to the daemon)."""
        if self._engine is not None:
            engine, self._engine, self._images = self._engine, None, None
            await engine.aclose()

    def host_euid(self) -> int:
        """The uid :meth:`build_config` checks for rule-based policies (a seam)."""
        return os.geteuid()

    def find_program(self, program: str) -> str | None:
        """Where :meth:`build_config` finds ``nsenter`` and ``nft`` (a seam, as ``host_euid``)."""
        return shutil.which(program)

    def resolve_host(self, host: str) -> list[str]:
        """The addresses an allowlisted ``host`` is allowed at (blocking; a seam)."""
        return netpolicy.lookup(host)

    def preflight(self) -> None:
        """Raise :class:`ComponentError` when the daemon's socket is not there or not a unix socket path."""
        try:
            path = socket_path(self.options.host)
        except ValueError as exc:
            raise ComponentError(f"environment 'docker': {exc}") from None
        if not os.path.exists(path):
            raise ComponentError(f"environment 'docker': no docker daemon socket at {path} (set host or DOCKER_HOST)")

    def build_config(self, plan: ExecutionPlan) -> OpenConfig:
        """The image (or build context) and container settings of ``plan``;
        reject policies other than ``none``, ``allowlist`` and ``full``."""
        for phase, policy in (
            ("baseline", plan.baseline_network_policy),
            ("run", plan.run_network_policy),
            ("evaluation", plan.evaluation_network_policy),
        ):
            netpolicy.check(policy, "docker", f"{phase} network policy of task {plan.task_id!r}")
        ruled = {
            p.mode for p in (plan.baseline_network_policy, plan.run_network_policy, plan.evaluation_network_policy)
        }
        if ruled & {"none", "allowlist"}:
            missing = [p for p in ("nsenter", "nft") if self.find_program(p) is None]
            if self.host_euid() != 0 or missing:
                need = "root" if self.host_euid() != 0 else ", ".join(missing)
                raise ComponentError(
                    f"environment 'docker' enforces policies none and allowlist with nftables from the host "
                    f"and needs {need} for task {plan.task_id!r}"
                )
        spec = plan.sandbox
        options = self.options
        image = spec.image
        context = os.fspath(spec.build_context) if spec.build_context is not None else None
        if image is None and context is None:
            image = options.default_image
            if image is None:
                raise ComponentError(
                    f"environment 'docker': task {plan.task_id!r} names no image and has no build context; "
                    "set the provider's default_image"
                )
        container = ContainerSpec(
            workdir=spec.workdir,
            env=dict(spec.env),
            user=spec.user,
            cpus=spec.cpus if spec.cpus is not None else options.cpus,
            memory_mb=spec.memory_mb if spec.memory_mb is not None else options.memory_mb,
            storage_mb=spec.storage_mb,
            pids_max=options.pids_max,
        )
        return OpenConfig(plan.task_id, image, context, spec.build_timeout_seconds, container)

    async def image_for(self, config: OpenConfig) -> ImageReport:
        """The image a session of ``config`` runs, pulled or built (once) as
        ``image_source`` says, and what building it produced (its log, its
        seconds, a WARNING ``image_built_instead``). A build or pull failure
        is FATAL ``image_build_failed``; one longer than
        ``build_timeout_seconds`` is FATAL ``setup_timeout``."""
        bound = config.build_timeout_seconds
        source = self.options.image_source
        with trio.move_on_after(bound if bound is not None else float("inf")) as scope:
            if config.image is None or (source == "build" and config.build_context is not None):
                return await self._built(config)
            try:
                return ImageReport(await self.images.pulled(config.image, self.options.pull))
            except IssueError as exc:
                if source != "prebuilt_else_build" or config.build_context is None:
                    raise
                reason = exc.message.splitlines()[0]
            report = await self._built(config)
            if self._built_instead:
                return report
            self._built_instead = True
            warning = Issue(
                "warning",
                "setup",
                "image_built_instead",
                f"{reason}; built the task's Dockerfile instead (image_source prebuilt_else_build)",
            )
            return attrs.evolve(report, issues=(warning,))
        assert scope.cancelled_caught
        what = config.image or config.build_context
        raise IssueError("fatal", "setup_timeout", f"preparing the image of {what} took over {bound}s", phase="setup")

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> DockerSession:
        """Make sure of the image, then create the session's network and
        container under ``policy``. ``name`` labels both (a random
        ``docker-...`` name when ``None``). A failure or cancellation removes
        whatever was made before propagating."""
        if config is None:
            raise ComponentError("environment 'docker': open needs the config build_config returned")
        if name is None:
            name = "docker-" + secrets.token_hex(6)
        if not NAME_RE.fullmatch(name):
            raise fail(f"docker session name {name!r} must match [a-z0-9-]{{1,40}}")
        try:
            netpolicy.check(policy, "docker", "network policy")
        except ComponentError as exc:
            raise fail(str(exc)) from None
        try:
            report = await self.image_for(config)
        except (EngineError, httpx.HTTPError) as exc:
            raise IssueError("fatal", "image_build_failed", f"docker daemon: {exc}", phase="setup") from None
        image = report.image
        session = DockerSession(self.engine, name, self.options.max_output_bytes, self.resolve_host)
        session.on_not_private = self._not_private
        session.open_issues, session.open_logs, session.open_timings = report.issues, report.logs, report.timings
        try:
            container = config.container
            if container.storage_mb is not None and not self._storage:
                container = attrs.evolve(container, storage_mb=None)
            optional = self.options.storage == "if_supported"
            await session.start(image, container, policy, expose=self._exposing, storage_optional=optional)
            if self._exposing and session.exposed is None:
                self._exposing = False  # the daemon cannot bind this host's directories: stop trying
            if session.storage_refused and self._storage:
                self._storage = False  # and say so once
                log.warning(
                    "storage_not_limited",
                    message=f"the docker daemon cannot limit a container's storage ({session.storage_refused}); "
                    "tasks' storage_mb is not enforced (environment config storage: required refuses them instead)",
                )
        except BaseException as exc:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await session.close()
            if isinstance(exc, EngineError | httpx.HTTPError):
                raise fail(f"docker session {name}: {exc}") from None
            raise
        return session

    def _not_private(self, reason: str) -> None:
        """Say once per provider (per run) that the verifier runs beside the agent's processes, and why."""
        if self._private_warned:
            return
        self._private_warned = True
        log.warning(
            "verifier_not_private",
            message=f"under docker the verifier runs in the container beside the processes the agent left running "
            f"(no private run: {reason}): one of them can change its tests or its reward (docs/docker.md, threat model)",
        )

    async def _built(self, config: OpenConfig) -> ImageReport:
        """The image of the task's Dockerfile; its log and seconds when this open built it."""
        assert config.build_context is not None
        start = trio.current_time()
        tag = await self.images.built(config.task_id, Path(config.build_context))
        log = self.images.build_logs.pop(tag, None)  # there only for the open that built it
        if log is None:
            return ImageReport(tag)
        return ImageReport(tag, logs={"build.log": log}, timings={"image_build": trio.current_time() - start})

    async def reap(self, handle: dict[str, Any]) -> None:
        """Remove the container, network and exposures ``handle`` names (idempotent)."""
        if not isinstance(handle, dict) or not NAME_RE.fullmatch(str(handle.get("name"))):
            raise IssueError("warning", "cleanup_failed", f"not a docker handle: {handle!r}")
        container = handle.get("container") or handle["name"]
        network = handle.get("network") or handle["name"]
        try:
            await remove(self.engine, str(container), str(network))
        finally:
            await self._destroy_state(partial(_expose.destroy, handle["name"]))

    async def sweep(self, tag: str) -> None:
        """Remove every container and network labelled with a session name
        starting with ``tag``, and those sessions' exposures."""
        if not tag or not NAME_RE.fullmatch(tag):
            raise ValueError(f"sweep tag {tag!r} is not 1-40 characters of [a-z0-9-]")
        filters = {"label": [SESSION_LABEL]}
        containers = await self.engine.request("GET", "/containers/json", params={"all": True, "filters": filters})
        networks = await self.engine.request("GET", "/networks", params={"filters": filters})
        for item in containers or []:
            if (item.get("Labels") or {}).get(SESSION_LABEL, "").startswith(tag):
                await remove(self.engine, item["Id"], None)
        for item in networks or []:
            if (item.get("Labels") or {}).get(SESSION_LABEL, "").startswith(tag):
                await remove(self.engine, None, item["Id"])
        await self._destroy_state(lambda: _expose.sweep(tag))

    async def _destroy_state(self, destroy: Callable[[], None]) -> None:
        """Run an ``_expose`` teardown where this process could have made state directories (as root)."""
        if self.host_euid() == 0:
            try:
                await trio.to_thread.run_sync(destroy)
            except (OSError, _expose.HostError) as exc:
                raise IssueError("warning", "cleanup_failed", f"docker: {exc}") from None
