"""A small Chrome DevTools Protocol client for the headless Chromium UI test (no browser download)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def start_chromium(purpose: str) -> Chromium:
    """A headless Chromium for ``purpose`` (a test), or the test skipped without one; where
    ``EPOCHSYNC_REQUIRE_UI`` is set (CI installed the browser) a missing browser fails it."""
    import pytest

    binary = chromium_binary()
    if binary is None:
        why = f"Chromium is not installed: install Debian's package (apt-get install -y chromium) to run {purpose}"
        if os.environ.get("EPOCHSYNC_REQUIRE_UI"):
            pytest.fail(why)
        pytest.skip(why)
    return Chromium(binary)


class Chromium:
    """Headless Chromium with one page, driven over its DevTools websocket."""

    def __init__(self, binary: str, *, width: int = 1400, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="epochsync-chromium-")
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                f"--window-size={width},{height}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        port = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and port is None:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = int(m.group(1))
        if port is None:
            raise RuntimeError("chromium did not open its DevTools port")
        self.port = port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            pages = [t for t in json.loads(resp.read()) if t["type"] == "page"]
        from websockets.sync.client import connect

        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self._id = 0
        self.send("Page.enable")
        self.send("Runtime.enable")

    def send(self, method: str, params: dict | None = None, timeout: float = 60) -> dict:
        self._id += 1
        my = self._id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", timeout=60)

    def js(self, expression: str):
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"javascript failed: {res['exceptionDetails'].get('text')}: {expression[:200]}")
        return res.get("result", {}).get("value")

    def wait_for(self, predicate: str, *, timeout: float = 60, interval: float = 0.5, what: str = ""):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.js(predicate)
            except RuntimeError:
                last = None
            if last:
                return last
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what or predicate}")

    def text(self) -> str:
        return self.js("document.body ? document.body.innerText : ''") or ""

    def type_into(self, selector: str, value: str) -> None:
        """Set an input's value the way React notices (native setter + input event)."""
        self.js(
            "(() => {const el = document.querySelector(" + json.dumps(selector) + ");"
            "const set = Object.getOwnPropertyDescriptor(window.HTMLInputElement.prototype, 'value').set;"
            "el.focus(); set.call(el, " + json.dumps(value) + ");"
            "el.dispatchEvent(new Event('input', {bubbles: true}));"
            "el.dispatchEvent(new Event('change', {bubbles: true})); return true;})()"
        )

    def click_text(self, text: str, *, selector: str = "button", exact: bool = True, last: bool = False) -> bool:
        """Click the (first or last) visible element matching ``selector`` whose text is ``text``."""
        cond = "t === want" if exact else "t.includes(want)"
        return bool(
            self.js(
                "(() => {const want = " + json.dumps(text) + ";"
                "const els = [...document.querySelectorAll(" + json.dumps(selector) + ")].filter(e => {"
                "const t = (e.innerText || e.getAttribute('aria-label') || '').trim();"
                "return (" + cond + ") && e.offsetParent !== null && !e.disabled;});"
                "if (!els.length) return false; const el = els[" + ("els.length - 1" if last else "0") + "];"
                "el.scrollIntoView(); el.click(); return true;})()"
            )
        )

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, 9)
        shutil.rmtree(self.profile, ignore_errors=True)
