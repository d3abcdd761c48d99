"""Headless Chromium (Debian's `chromium`) driven through the Chrome DevTools Protocol over
its websocket: a page to open, script to evaluate in it, screenshots."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import websockets

FLAGS = (
    "--headless",
    "--no-sandbox",  # as root, in a container
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)
_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


class BrowserError(Exception):
    """Chromium did not start, or a call of the protocol failed."""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.asynccontextmanager
async def browser(profile: Path, width: int = 1280, height: int = 900) -> AsyncIterator[Page]:
    """A fresh Chromium (its own profile directory) with one page of that size."""
    binary = chromium()
    if binary is None:
        raise BrowserError("no chromium on PATH: apt-get install -y chromium")
    process = await asyncio.create_subprocess_exec(
        binary,
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        url = await _devtools_url(process)
        port = url.split("/")[2]
        async with websockets.connect(url, max_size=None) as connection:
            target = await Page(connection).send("Target.createTarget", url="about:blank")
        page_url = f"ws://{port}/devtools/page/{target['targetId']}"
        async with websockets.connect(page_url, max_size=None) as connection:
            page = Page(connection)
            await page.send("Page.enable")
            await page.send("Runtime.enable")
            await page.send(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            yield page
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def _devtools_url(process: asyncio.subprocess.Process) -> str:
    assert process.stderr is not None
    async with asyncio.timeout(20):
        while line := await process.stderr.readline():
            found = _LISTENING.search(line)
            if found:
                return found[1].decode()
    raise BrowserError("chromium ended before it listened")


class Page:
    """One page's protocol connection: commands, and the events that came meanwhile."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        command = {"id": number, "method": method, "params": params}
        await self.connection.send(orjson.dumps(command).decode())  # a text frame
        async with asyncio.timeout(20):
            while True:
                message = orjson.loads(await self.connection.recv())
                if message.get("id") == number:
                    if "error" in message:
                        raise BrowserError(f"{method}: {message['error']}")
                    result: dict[str, Any] = message["result"]
                    return result
                self.events.append(message)

    async def open(self, url: str) -> None:
        """Go to `url`, and wait until it has loaded."""
        self.events.clear()
        await self.send("Page.navigate", url=url)
        async with asyncio.timeout(20):
            while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
                self.events.append(orjson.loads(await self.connection.recv()))

    async def evaluate(self, expression: str) -> Any:
        """The value of a script expression in the page (a promise awaited)."""
        found = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in found:
            raise BrowserError(f"{expression}: {found['exceptionDetails']}")
        return found["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 5.0) -> Any:
        """The expression's value once it is truthy, checked every 20 ms."""
        async with asyncio.timeout(timeout):
            while not (value := await self.evaluate(expression)):
                await asyncio.sleep(0.02)
        return value

    async def screenshot(self, path: Path) -> bytes:
        """A PNG of the whole page (as tall as its content), written to `path`."""
        metrics = await self.send("Page.getLayoutMetrics")
        size = metrics["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = await self.send(
            "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True
        )
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        return data
