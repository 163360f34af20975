"""Headless Chromium driven over the DevTools protocol (no extra dependency: the ``websockets``
client ships with Streamlit).

``--dump-dom``/``--screenshot`` fire at the page's load event, before a Streamlit app has drawn
anything (its content arrives later over a websocket), so the page is polled until the wanted
elements exist, then captured.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from cliffguard.controller.broker import free_port

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--remote-allow-origins=*",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Chromium:
    """One headless browser with one page; ``close()`` always ends the process."""

    def __init__(self, user_data_dir: Path, width: int = 1400, height: int = 2400) -> None:
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("chromium is not installed")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", f"--remote-debugging-port={self.port}",
             "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.width, self.height = width, height
        self._ids = itertools.count(1)
        self._ws: Any = None
        try:
            self._ws = self._connect()
            self.call("Page.enable")
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise

    def _connect(self) -> Any:
        deadline = time.monotonic() + 25
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as resp:
                    pages = [t for t in json.load(resp) if t.get("type") == "page"]
                if pages:
                    ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=256 * 2**20, open_timeout=20)
                    return ws.__enter__()  # held open until close()
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium's DevTools endpoint did not come up")
            time.sleep(0.2)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == msg_id:  # events (no id) are not needed here
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        """Poll a JS expression until it is truthy; its last value either way."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.3)
        return value

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def dom(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))

    def close(self) -> None:
        try:
            if self._ws is not None:
                self._ws.close()
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
