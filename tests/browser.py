"""One headless Chromium for many pages, driven over its DevTools pipe (the Chrome DevTools
Protocol, `--remote-debugging-pipe`: JSON messages ended by a NUL byte, read by Chromium on its
descriptor 3 and written on its descriptor 4).

`render` opens a page in a new tab with the network off, lets its scripts run for a budget of
virtual time (what `--virtual-time-budget` does for `--dump-dom`), and returns its DOM, what it
logged (console calls, uncaught errors, the browser's own log entries such as a refused
request) and a screenshot. A browser started once serves every page of a test module: a new
Chromium for each page costs a second or two of CPU for the browser's own processes, and now
and then, on a busy machine, never exits (seen with `--dump-dom`); this one is killed, its
whole process group, when it is closed, and a page that does not finish within `timeout`
seconds raises TimeoutError. `Pages` starts a new browser once when one stops answering.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

# the network off: every connection goes to a closed port, every name fails to resolve
NO_NETWORK = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]
# no background work of the browser's own (updates, sync, field trials) to wait on or fail
QUIET = ["--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-default-apps"]
LOGGED = ("Runtime.consoleAPICalled", "Runtime.exceptionThrown", "Log.entryAdded")


class Chromium:
    """A headless Chromium (`executable`) with its own profile in `profile`; `close()` ends
    it. Not thread-safe: one caller at a time."""

    def __init__(self, executable: str, profile: Path) -> None:
        """Start it; what it prints goes to `profile`/chromium.log."""
        ours_in, its_out = os.pipe()  # it writes on its 4, we read
        its_in, ours_out = os.pipe()  # we write, it reads on its 3
        # its ends above 4 first: neither is overwritten by the other's move to 3 or 4
        its_in, its_out = (_above_4(fd) for fd in (its_in, its_out))

        def on_3_and_4() -> None:
            os.dup2(its_in, 3)
            os.dup2(its_out, 4)

        profile.mkdir(parents=True, exist_ok=True)
        self.log = profile / "chromium.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [executable, "--headless", "--no-sandbox", "--disable-gpu", *QUIET,
                 *NO_NETWORK, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                 "about:blank"],
                preexec_fn=on_3_and_4, pass_fds=(3, 4), start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        os.close(its_in)
        os.close(its_out)
        self._in, self._out = ours_in, ours_out
        self._buffer = b""
        self._last_id = 0
        self._events: list[dict[str, Any]] = []

    def render(self, page: Path, screenshot: Path, width: int = 1300, height: int = 3600,
               budget_ms: int = 3000, timeout: float = 60.0) -> tuple[str, list[str]]:
        """`page` opened in a new tab of `width` x `height` pixels, its scripts run for
        `budget_ms` of virtual time: (its DOM, what it logged); its screenshot (PNG) is saved
        as `screenshot`. TimeoutError past `timeout` seconds."""
        deadline = time.monotonic() + timeout
        target = self.call("Target.createTarget", deadline, url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", deadline, targetId=target,
                            flatten=True)["sessionId"]
        try:
            for domain in ("Runtime", "Log", "Page"):
                self.call(f"{domain}.enable", deadline, session)
            self.call("Emulation.setDeviceMetricsOverride", deadline, session, width=width,
                      height=height, deviceScaleFactor=1, mobile=False)
            self.call("Emulation.setVirtualTimePolicy", deadline, session, policy="pause")
            self.call("Page.navigate", deadline, session, url=page.as_uri())
            self.call("Emulation.setVirtualTimePolicy", deadline, session,
                      policy="pauseIfNetworkFetchesPending", budget=budget_ms)
            while not self._seen("Emulation.virtualTimeBudgetExpired", session):
                self._read(deadline)
            dom = self.call("Runtime.evaluate", deadline, session, returnByValue=True,
                            expression="document.documentElement.outerHTML")["result"]["value"]
            shot = self.call("Page.captureScreenshot", deadline, session, format="png")
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            logged = [_line(e) for e in self._events
                      if e.get("sessionId") == session and e["method"] in LOGGED]
        finally:
            self._events = [e for e in self._events if e.get("sessionId") != session]
            with contextlib.suppress(TimeoutError, EOFError, RuntimeError, OSError):
                self.call("Target.closeTarget", time.monotonic() + 5, targetId=target)
        return dom, logged

    def call(self, method: str, deadline: float, session: str | None = None,
             **params: Any) -> dict[str, Any]:
        """The result of one DevTools command (of the tab `session`, else the browser's);
        RuntimeError with Chromium's error if it refused it."""
        self._last_id += 1
        message: dict[str, Any] = {"id": self._last_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._out, data):]
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._last_id:
                if "error" in reply:
                    raise RuntimeError(f"chromium refused {method}: {reply['error']}")
                return dict(reply["result"])

    def close(self) -> None:
        """End the browser and every process it started (its process group)."""
        for fd in (self._in, self._out):
            os.close(fd)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def _seen(self, method: str, session: str) -> bool:
        return any(e["method"] == method and e.get("sessionId") == session for e in self._events)

    def _read(self, deadline: float) -> dict[str, Any]:
        """The next message; an event of a tab is kept in `_events` too (the browser's own
        are not: nothing reads them)."""
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise EOFError(f"chromium exited ({self.proc.poll()}; see {self.log})")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        if "method" in message and "sessionId" in message:
            self._events.append(message)
        return message


class Pages:
    """Pages rendered in one Chromium (`Chromium.render`), with profiles in `folder`: a browser
    that stops answering or exits is said (a warning), closed, and started again for the page
    once; a page that a second browser cannot render either fails."""

    def __init__(self, executable: str, folder: Path) -> None:
        self.executable, self.folder = executable, folder
        self.launched = 0
        self.browser = self._launch()

    def render(self, page: Path, screenshot: Path) -> tuple[str, list[str]]:
        try:
            return self.browser.render(page, screenshot)
        except (TimeoutError, EOFError) as e:
            warnings.warn(f"chromium stopped on {page.name} ({e}): launched again",
                          stacklevel=2)
            self.browser.close()
            self.browser = self._launch()
            return self.browser.render(page, screenshot)

    def close(self) -> None:
        self.browser.close()

    def _launch(self) -> Chromium:
        self.launched += 1
        return Chromium(self.executable, self.folder / f"profile-{self.launched}")


def _above_4(fd: int) -> int:
    """A copy of descriptor `fd` numbered 5 or more (not inherited); `fd` is closed."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(fd)
    return moved


def _line(event: dict[str, Any]) -> str:
    """One logged event as a line: its kind, level and text."""
    params = event["params"]
    if event["method"] == "Runtime.consoleAPICalled":
        words = [str(a.get("value", a.get("description", ""))) for a in params["args"]]
        return f"console.{params['type']}: {' '.join(words)}"
    if event["method"] == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return f"uncaught: {details.get('exception', {}).get('description', details['text'])}"
    entry = params["entry"]
    return f"{entry['source']} {entry['level']}: {entry['text']}"
