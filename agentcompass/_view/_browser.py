"""A minimal WebDriver client for headless Chromium, to drive the viewer's
pages in its tests and its bench (``python -m bench.view``).

It speaks the W3C WebDriver protocol to Debian's ``chromedriver`` over
httpx, so it needs no browser download and no new dependency. It offers only
what the viewer's checks use: navigate, run a script, find, click, type,
read text and take screenshots. Not a general-purpose automation library.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

__all__ = ["CHROMEDRIVER", "CHROMIUM", "Browser", "WebDriverError", "browser_missing", "open_browser"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
_ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--allow-file-access-from-files",
]


class WebDriverError(RuntimeError):
    """The driver refused a command (no such element, script error, ...)."""


class StaleElementError(WebDriverError):
    """The element found is no longer in the page (a re-render replaced it)."""

#: Finds of an element that a re-render replaced between its find and its use.
_STALE_TRIES = 3


def browser_missing(chromium: str = CHROMIUM, chromedriver: str = CHROMEDRIVER) -> str | None:
    """Why the browser cannot run here, or None when it can."""
    for path in (chromium, chromedriver):
        if not Path(path).exists() and shutil.which(path) is None:
            return f"{path} is not installed (apt-get install chromium chromium-driver)"
    return None


class Browser:
    """One WebDriver session (one browser window)."""

    def __init__(self, client: httpx.AsyncClient, session_id: str) -> None:
        self._client = client
        self._base = f"/session/{session_id}"

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        response = await self._client.request(method, self._base + path, json=body)
        value = response.json().get("value")
        if response.status_code >= 400:
            message = value.get("message", "") if isinstance(value, dict) else str(value)
            error = value.get("error", "") if isinstance(value, dict) else ""
            kind = StaleElementError if error == "stale element reference" else WebDriverError
            raise kind(f"{error}: {message.splitlines()[0] if message else ''}")
        return value

    async def goto(self, url: str) -> None:
        await self._call("POST", "/url", {"url": url})

    async def execute(self, script: str, *args: Any) -> Any:
        """Run ``script`` (a function body; ``arguments`` holds ``args``) in the page."""
        return await self._call("POST", "/execute/sync", {"script": script, "args": list(args)})

    async def execute_async(self, script: str, *args: Any) -> Any:
        """Run ``script``; it calls ``arguments[arguments.length - 1](result)`` when done."""
        return await self._call("POST", "/execute/async", {"script": script, "args": list(args)})

    async def find(self, css: str) -> str:
        return (await self._call("POST", "/element", {"using": "css selector", "value": css}))[_ELEMENT]

    async def find_all(self, css: str) -> list[str]:
        found = await self._call("POST", "/elements", {"using": "css selector", "value": css})
        return [e[_ELEMENT] for e in found]

    async def _on(self, css: str, method: str, command: str, body: Any = None) -> Any:
        """``command`` on the element ``css`` finds, found again if the page
        replaced it between the find and the command (nothing was done then)."""
        for tries in range(1, _STALE_TRIES + 1):
            try:
                return await self._call(method, f"/element/{await self.find(css)}/{command}", body)
            except StaleElementError:
                if tries == _STALE_TRIES:
                    raise
        raise AssertionError("unreachable")

    async def click(self, css: str) -> None:
        await self._on(css, "POST", "click", {})

    async def type(self, css: str, text: str) -> None:
        await self._on(css, "POST", "value", {"text": text})

    async def keys(self, text: str) -> None:
        """Press the keys of ``text`` in whatever has the focus (as a person
        types: nothing is focused first)."""
        actions = [a for ch in text for a in ({"type": "keyDown", "value": ch}, {"type": "keyUp", "value": ch})]
        await self._call("POST", "/actions", {"actions": [{"type": "key", "id": "keyboard", "actions": actions}]})

    async def text(self, css: str) -> str:
        return str(await self._on(css, "GET", "text"))

    async def screenshot(self, path: Path) -> Path:
        data = base64.b64decode(await self._call("GET", "/screenshot"))
        await trio.to_thread.run_sync(path.write_bytes, data)
        return path

    async def wait_for(self, expression: str, *args: Any, interval: float = 0.05) -> Any:
        """Poll until the JavaScript ``expression`` is truthy; its value.
        Unbounded: the caller sets the deadline (``trio.fail_after``)."""
        while True:
            value = await self.execute(f"return ({expression});", *args)
            if value:
                return value
            await trio.sleep(interval)

    async def console_errors(self) -> list[str]:
        """Severe browser console messages (script errors) since the last call."""
        entries = await self._call("POST", "/se/log", {"type": "browser"})
        return [e.get("message", "") for e in entries if e.get("level") == "SEVERE"]


@asynccontextmanager
async def open_browser(
    profile_dir: Path,
    *,
    size: tuple[int, int] = (1400, 1000),
    flags: tuple[str, ...] = (),
    chromium: str = CHROMIUM,
    chromedriver: str = CHROMEDRIVER,
) -> AsyncIterator[Browser]:
    """Start ``chromedriver`` and a headless Chromium with a fresh profile in
    ``profile_dir`` (and ``flags`` beside the usual ones); stop both on exit.
    The caller bounds the start-up."""
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            [chromedriver, "--port=0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            assert process.stdout is not None
            port = await _driver_port(process.stdout)
            nursery.start_soon(_drain, process.stdout)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                args = [*_FLAGS, *flags, f"--window-size={size[0]},{size[1]}", f"--user-data-dir={profile_dir}"]
                capabilities = {"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"binary": chromium, "args": args},
                    "goog:loggingPrefs": {"browser": "ALL"},
                }}}
                response = await client.post("/session", json=capabilities)
                value = response.json().get("value") or {}
                if response.status_code >= 400 or "sessionId" not in value:
                    raise WebDriverError(f"cannot start Chromium: {str(value.get('message', value))[:300]}")
                session_id = value["sessionId"]
                try:
                    yield Browser(client, session_id)
                finally:
                    with trio.move_on_after(10, shield=True):
                        await client.delete(f"/session/{session_id}")
        finally:
            with trio.move_on_after(5, shield=True):
                process.kill()
                await process.wait()
            nursery.cancel_scope.cancel()


async def _driver_port(stdout: trio.abc.ReceiveStream) -> int:
    """The port chromedriver reports once it listens."""
    seen = b""
    marker = b"started successfully on port "
    while marker not in seen or not seen.split(marker, 1)[1].split(b".", 1)[1:]:
        chunk = await stdout.receive_some(4096)
        if not chunk:
            raise WebDriverError(f"chromedriver exited: {seen.decode(errors='replace')[-300:]}")
        seen += chunk
    return int(seen.split(marker, 1)[1].split(b".", 1)[0])


async def _drain(stdout: trio.abc.ReceiveStream) -> None:
    while await stdout.receive_some(4096):
        pass
