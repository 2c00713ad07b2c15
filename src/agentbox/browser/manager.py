# Whole on purpose: a browser's life (launch, worker thread, pages, idle close) is one machine
"""One headless Chromium per sandbox, running *inside* it, driven from the host.

Playwright's client and its node driver run on the host, in the gateway; the browser
process is started through :mod:`agentbox.browser.launch`, which runs Chromium with
``agentbox-nsexec enter --keep-fds 2`` in the sandbox's namespaces, a cgroup leaf of its
own (``b<hex>``, under the sandbox's memory and pids limits), its seccomp filter, as its
uid, behind its egress proxy. Playwright talks to it over the DevTools pipe (fds 3, 4).

Threads: Playwright's sync API belongs to the thread that started it, so each sandbox's
browser has a single-worker executor; tool handlers (gateway worker threads) submit to it
and wait. Pages are handles (``br-<hex>``), one browser context each. A janitor closes a
handle after ``idle_timeout`` seconds without calls, and the browser with its last handle;
``close_sandbox`` ends everything of a sandbox (the gateway calls it before a destroy).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import os
import re
import secrets
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agentbox.browser import launch
from agentbox.browser.snapshot import REF, compact
from agentbox.config.specs import NetworkSpec
from agentbox.errors import (
    AgentboxError,
    BrowserHandleNotFound,
    BrowserRefNotFound,
    CommandTimeout,
    HostUnsupported,
    InvalidRequest,
    LimitExceeded,
    NavigationFailed,
    PolicyDenied,
    SandboxError,
)
from agentbox.network import egressca, plane
from agentbox.network.names import normalize_pattern

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Locator, Page, Playwright

    from agentbox.runtime.runtime import Runtime

T = TypeVar("T")
CHROMIUM = "/usr/lib/chromium/chromium"
HANDLE = re.compile(r"^br-[0-9a-f]{12}$")
URL_SCHEMES = ("http", "https", "file", "about", "data")
PROFILE_PREFIX = "/tmp/.agentbox-browser-"
MAX_SCREENSHOT_BYTES = 16 * 1024 * 1024
# Measured (docs/design.md, "Isolation tiers"): the first page took the gVisor sandbox's
# host cgroup to ~370 tasks, four pages to ~600 (runsc keeps ptrace stubs for reuse);
# sandboxes with the default 512 (+128 headroom) were ended by the pids controller.
GVISOR_MIN_PIDS = 2048
_GRACE_S = 10.0  # on top of an operation's own timeout, before the caller gives up
_SETTLE_MS = 5000  # after DOMContentLoaded, how long to wait for "load" at most
FONTS_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <dir>/usr/share/fonts</dir>
  <cachedir>{cache}</cachedir>
</fontconfig>
"""
_TEXT_JS = "() => document.body ? document.body.innerText : document.documentElement.innerText"


@dataclass(frozen=True)
class BrowserConfig:
    headless: bool = True
    width: int = 1280
    height: int = 800
    idle_timeout: float = 300.0
    max_pages: int = 8  # open handles per sandbox
    chromium: str = CHROMIUM
    launch_timeout: float = 60.0
    # Domains the sandbox's egress path must refuse (NetworkSpec.deny) before a browser
    # starts there: the gateway puts them in every sandbox it creates.
    block_domains: tuple[str, ...] = ()


@dataclass
class _Handle:
    id: str
    last_used: float
    busy: int = 0
    context: BrowserContext | None = None
    page: Page | None = None
    navigations: int = 0


@dataclass
class _Browser:
    """One sandbox's Chromium. Everything Playwright happens on ``executor``'s thread."""

    sandbox_id: str
    executor: concurrent.futures.ThreadPoolExecutor
    handles: dict[str, _Handle] = field(default_factory=dict)
    playwright: Playwright | None = None
    browser: Browser | None = None
    leaf: str | None = None
    # The runner's: how a leaf's tree is killed, and killed and dropped, is the tier's.
    kill_leaf: Callable[[str], None] | None = None
    end_leaf: Callable[[str], None] | None = None
    profile: str | None = None
    ended: str | None = None  # why the browser process is gone, once it is


class BrowserManager:
    def __init__(self, runtime: Runtime, config: BrowserConfig | None = None) -> None:
        self.runtime = runtime
        self.config = config or BrowserConfig()
        self._browsers: dict[str, _Browser] = {}
        self._closed: dict[tuple[str, str], str] = {}  # recently closed handles: why
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._janitor: threading.Thread | None = None

    # the tools' operations ------------------------------------------------------------
    def open(
        self, sandbox_id: str, url: str, handle: str | None, timeout_s: float, max_chars: int
    ) -> dict[str, Any]:
        check_url(url)
        timeout_ms = _ms(timeout_s)

        def run(b: _Browser, h: _Handle) -> dict[str, Any]:
            if h.page is None:
                self._new_page(b, h, timeout_ms)
            page = _page(h)
            try:
                response = page.goto(url, wait_until="domcontentloaded", timeout=timeout_ms)
            except Exception as e:
                raise _navigation_error(e, url) from None
            _settle(page)
            text, truncated = _text(page, max_chars)
            return {
                **_where(h),
                "status": response.status if response is not None else None,
                "text": text,
                "truncated": truncated,
            }

        if handle is None:
            return self._submit(sandbox_id, None, run, timeout_s, create=True)
        return self._submit(sandbox_id, handle, run, timeout_s)

    def snapshot(
        self, sandbox_id: str, handle: str, timeout_s: float, max_chars: int, with_text: bool
    ) -> dict[str, Any]:
        def run(b: _Browser, h: _Handle) -> dict[str, Any]:
            page = _page(h)
            raw = page.aria_snapshot(mode="ai", timeout=_ms(timeout_s))
            snap = compact(raw, max_chars)
            out = {
                **_where(h),
                "snapshot": snap.text,
                "refs": len(snap.elements),
                "truncated": snap.truncated,
            }
            if with_text:
                out["text"], out["text_truncated"] = _text(page, max_chars)
            return out

        return self._submit(sandbox_id, handle, run, timeout_s)

    def click(self, sandbox_id: str, handle: str, ref: str, timeout_s: float) -> dict[str, Any]:
        def run(b: _Browser, h: _Handle) -> dict[str, Any]:
            before = h.navigations
            locator = _ref(_page(h), ref)
            with _action_errors(ref, "click"):
                locator.click(timeout=_ms(timeout_s))
            return _after_action(h, before)

        return self._submit(sandbox_id, handle, run, timeout_s)

    def type_text(
        self, sandbox_id: str, handle: str, ref: str, text: str, submit: bool, timeout_s: float
    ) -> dict[str, Any]:
        def run(b: _Browser, h: _Handle) -> dict[str, Any]:
            before = h.navigations
            locator = _ref(_page(h), ref)
            timeout = _ms(timeout_s)
            with _action_errors(ref, "type into"):
                if locator.evaluate("e => e.tagName") == "SELECT":
                    locator.select_option(label=text, timeout=timeout)
                else:
                    locator.fill(text, timeout=timeout)
                if submit:
                    locator.press("Enter", timeout=timeout)
            return _after_action(h, before)

        return self._submit(sandbox_id, handle, run, timeout_s)

    def press(
        self, sandbox_id: str, handle: str, key: str, ref: str | None, timeout_s: float
    ) -> dict[str, Any]:
        def run(b: _Browser, h: _Handle) -> dict[str, Any]:
            before = h.navigations
            page = _page(h)
            with _action_errors(ref or "the page", "press a key on"):
                if ref is None:
                    page.keyboard.press(key)
                else:
                    _ref(page, ref).press(key, timeout=_ms(timeout_s))
            return _after_action(h, before)

        return self._submit(sandbox_id, handle, run, timeout_s)

    def screenshot(
        self, sandbox_id: str, handle: str, full_page: bool, timeout_s: float
    ) -> dict[str, Any]:
        def run(b: _Browser, h: _Handle) -> dict[str, Any]:
            png = _page(h).screenshot(type="png", full_page=full_page, timeout=_ms(timeout_s))
            if len(png) > MAX_SCREENSHOT_BYTES:
                raise LimitExceeded(
                    f"the screenshot is {len(png)} bytes (cap {MAX_SCREENSHOT_BYTES}); "
                    "take it without full_page"
                )
            width, height = png_size(png)
            return {
                **_where(h),
                "mime_type": "image/png",
                "width": width,
                "height": height,
                "png_base64": base64.b64encode(png).decode(),
            }

        return self._submit(sandbox_id, handle, run, timeout_s)

    def close(self, sandbox_id: str, handle: str) -> dict[str, Any]:
        with self._lock:
            b = self._browsers.get(sandbox_id)
            h = b.handles.get(handle) if b is not None else None
            if b is None or h is None:
                raise self._unknown(sandbox_id, handle)
            del b.handles[handle]
            self._remember(sandbox_id, handle, "it was closed with browser_close")
            last = not b.handles
            if last:
                del self._browsers[sandbox_id]
        future = b.executor.submit(_close_handle, h)
        if last:
            future = b.executor.submit(self._shutdown, b)
            b.executor.shutdown(wait=False)
        with contextlib.suppress(Exception):
            future.result(timeout=30)
        return {"handle": handle, "closed": True}

    # lifecycle ----------------------------------------------------------------------
    def handles(self, sandbox_id: str) -> list[str]:
        with self._lock:
            b = self._browsers.get(sandbox_id)
            return sorted(b.handles) if b is not None else []

    def leaf(self, sandbox_id: str) -> str | None:
        """The cgroup leaf (under the sandbox's) that the browser runs in, if any."""
        with self._lock:
            b = self._browsers.get(sandbox_id)
            return b.leaf if b is not None else None

    def close_sandbox(self, sandbox_id: str, timeout: float = 30.0) -> None:
        """End the sandbox's browser and every handle (before the sandbox is destroyed)."""
        with self._lock:
            b = self._browsers.pop(sandbox_id, None)
            if b is None:
                return
            for handle in b.handles:
                self._remember(sandbox_id, handle, "its sandbox was destroyed")
            b.handles.clear()
        # The browser dies at once (an operation in flight fails fast); Playwright, the
        # leaf and the profile are cleaned up on the browser's own thread.
        self._kill(b)
        future = b.executor.submit(self._shutdown, b)
        b.executor.shutdown(wait=False)
        with contextlib.suppress(Exception):
            future.result(timeout=timeout)

    def close_all(self) -> None:
        self._stop.set()
        with self._lock:
            ids = list(self._browsers)
        for sandbox_id in ids:
            self.close_sandbox(sandbox_id)
        if self._janitor is not None:
            self._janitor.join(timeout=10)

    # internals ------------------------------------------------------------------------
    def _submit(
        self,
        sandbox_id: str,
        handle: str | None,
        op: Callable[[_Browser, _Handle], T],
        timeout_s: float,
        *,
        create: bool = False,
    ) -> T:
        self.runtime.running(sandbox_id)  # typed errors for a sandbox that is gone
        with self._lock:
            b = self._browsers.get(sandbox_id)
            if create:
                if b is None or b.ended:
                    if b is not None:
                        self._retire(b)
                    b = self._new_browser(sandbox_id)
                if len(b.handles) >= self.config.max_pages:
                    raise LimitExceeded(
                        f"{len(b.handles)} browser pages are open in this sandbox (the cap); "
                        "close one with browser_close"
                    )
                h = _Handle("br-" + secrets.token_hex(6), time.monotonic())
                b.handles[h.id] = h
            else:
                assert handle is not None
                h_or_none = b.handles.get(handle) if b is not None else None
                if b is None or h_or_none is None:
                    raise self._unknown(sandbox_id, handle)
                h = h_or_none
            h.busy += 1
            h.last_used = time.monotonic()
        browser = b
        try:
            future = browser.executor.submit(self._guarded, browser, h, op)
        except RuntimeError:  # closed between the lookup and now
            with self._lock:
                h.busy -= 1
            raise self._unknown(sandbox_id, h.id) from None
        try:
            return future.result(timeout=timeout_s + self.config.launch_timeout + _GRACE_S)
        except concurrent.futures.TimeoutError:
            raise CommandTimeout(
                f"the browser did not answer within {timeout_s:g} s; try again, or "
                "browser_close the handle and open the page again"
            ) from None
        except BaseException:
            if create:  # the caller never learns this handle: close it
                self._drop(browser, h)
            raise
        finally:
            with self._lock:
                h.busy -= 1
                h.last_used = time.monotonic()

    def _guarded(self, b: _Browser, h: _Handle, op: Callable[[_Browser, _Handle], T]) -> T:
        """Run ``op`` on the browser's thread; Playwright errors become agentbox errors."""
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        if b.ended:
            raise _ended(b)
        try:
            return op(b, h)
        except AgentboxError:
            raise
        except PlaywrightTimeout as e:
            raise CommandTimeout(f"the browser timed out: {_first_line(e)}") from None
        except PlaywrightError as e:
            if b.ended or (b.browser is not None and not b.browser.is_connected()):
                b.ended = b.ended or "the browser process ended"
                raise _ended(b) from None
            raise SandboxError(f"the browser failed: {_first_line(e)}") from None

    def _new_browser(self, sandbox_id: str) -> _Browser:
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"browser-{sandbox_id}"
        )
        b = _Browser(sandbox_id, executor)
        self._browsers[sandbox_id] = b
        if self._janitor is None:
            self._janitor = threading.Thread(
                target=self._reap_idle, name="browser-janitor", daemon=True
            )
            self._janitor.start()
        return b

    def _new_page(self, b: _Browser, h: _Handle, timeout_ms: int) -> None:
        if b.browser is None:
            self._start(b)
        assert b.browser is not None
        context = b.browser.new_context(
            viewport={"width": self.config.width, "height": self.config.height},
            accept_downloads=False,  # a download would be saved to a host path
        )
        context.set_default_timeout(timeout_ms)
        page = context.new_page()
        h.context, h.page = context, page
        _watch(h, page)

        def adopt(popup: Page) -> None:  # a link opened a new tab: follow it
            if popup is h.page:
                return
            h.page = popup
            h.navigations += 1
            _watch(h, popup)

        context.on("page", adopt)

    def _start(self, b: _Browser) -> None:
        """Launch Chromium in the sandbox (on the browser's thread)."""
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise HostUnsupported(
                "playwright is not installed: pip install playwright (the version pinned in "
                "pyproject.toml); never `playwright install`: Debian's chromium is used"
            ) from None
        chromium = self.config.chromium
        if not os.access(chromium, os.X_OK):
            raise HostUnsupported(
                f"Chromium is not installed at {chromium}: apt-get install -y chromium "
                "fonts-dejavu-core (scripts/install.sh does)"
            )
        record = self.runtime.running(b.sandbox_id)[0]
        if record.isolation == "gvisor" and record.spec.pids < GVISOR_MIN_PIDS:
            raise LimitExceeded(
                f"the browser on the gvisor tier needs pids >= {GVISOR_MIN_PIDS} (this "
                f"sandbox has {record.spec.pids}): under runsc's ptrace platform every "
                "Chromium thread is a host thread, and a sandbox past its pids limit ends "
                f"whole; create the sandbox with pids={GVISOR_MIN_PIDS} or more"
            )
        runner = self.runtime.commands(b.sandbox_id)
        files = self.runtime.files(b.sandbox_id)
        if not files.exists(chromium):
            raise InvalidRequest(
                f"this sandbox's template has no {chromium}; use the default template or "
                "a template built with the chromium package"
            )
        tag = secrets.token_hex(6)
        b.profile = PROFILE_PREFIX + tag
        files.mkdir(b.profile)
        extra_env: dict[str, str] = {}
        if not files.exists("/etc/fonts/fonts.conf"):  # the default template has no /etc/fonts
            conf = f"{b.profile}/fonts.conf"
            files.write(conf, FONTS_CONF.format(cache=f"{b.profile}/fontconfig").encode())
            extra_env["FONTCONFIG_FILE"] = conf
        network = record.spec.network
        proxy = trusted_spki = None
        if network.mode != "none":
            self._check_blocked(network)
            proxy = f"http://{self.runtime.net.proxy_address}:{plane.EXPLICIT_PORT}"
        if network.mode != "none" and network.credentials:
            ca = egressca.EgressCA.load_or_create(egressca.ca_dir(self.runtime.home))
            trusted_spki = ca.spki_sha256()
        b.leaf = runner.new_leaf("b")
        b.kill_leaf, b.end_leaf = runner.kill_tree, runner.end_leaf
        spec = {
            **runner.browser_launch(chromium, b.leaf, "/tmp", runner.environment(extra_env)),
            "chromium": chromium,
            "user_data_dir": f"{b.profile}/profile",
            "proxy": proxy,
            "trusted_spki": trusted_spki,
        }
        script = launch.launcher_script(self.runtime.home / "lib")
        b.playwright = sync_playwright().start()
        try:
            b.browser = b.playwright.chromium.launch(
                executable_path=str(script),
                headless=self.config.headless,
                env={launch.SPEC_ENV: json.dumps(spec)},
                timeout=self.config.launch_timeout * 1000,
            )
        except Exception as e:
            self._shutdown(b)
            why = _launch_log(e)
            raise SandboxError(f"could not start Chromium in the sandbox: {why}") from None
        browser = b.browser

        def ended(_: object) -> None:
            b.ended = b.ended or "the browser process ended (crashed, killed or out of memory)"

        browser.on("disconnected", ended)

    def _check_blocked(self, network: NetworkSpec) -> None:
        check_blocked(network, self.config.block_domains)

    def _shutdown(self, b: _Browser) -> None:
        """Close everything of ``b`` (on its thread); never raises."""
        b.ended = b.ended or "the browser was closed"
        for h in list(b.handles.values()):
            _close_handle(h)
        if b.browser is not None:
            with contextlib.suppress(Exception):
                b.browser.close()
        if b.playwright is not None:
            with contextlib.suppress(Exception):
                b.playwright.stop()
        b.browser = b.playwright = None
        self._kill(b, remove=True)
        if b.profile is not None:
            with contextlib.suppress(AgentboxError, OSError):
                self.runtime.files(b.sandbox_id).remove(b.profile, recursive=True)

    def _kill(self, b: _Browser, remove: bool = False) -> None:
        """SIGKILL everything in the browser's leaf (and remove it): nothing outlives it."""
        if b.leaf is None or b.kill_leaf is None or b.end_leaf is None:
            return
        with contextlib.suppress(AgentboxError, OSError, subprocess.SubprocessError):
            (b.end_leaf if remove else b.kill_leaf)(b.leaf)

    def _retire(self, b: _Browser) -> None:
        """Drop an ended browser (lock held) and clean it up on its own thread."""
        self._browsers.pop(b.sandbox_id, None)
        for handle in b.handles:
            self._remember(b.sandbox_id, handle, b.ended or "its browser ended")
        b.handles.clear()
        b.executor.submit(self._shutdown, b)
        b.executor.shutdown(wait=False)

    def _drop(self, b: _Browser, h: _Handle) -> None:
        """Forget a handle nobody knows of; the browser goes too if it was the last."""
        with self._lock:
            if b.handles.get(h.id) is h:
                del b.handles[h.id]
            if not b.handles and self._browsers.get(b.sandbox_id) is b:
                self._retire(b)  # closing the browser closes the context
                return
        with contextlib.suppress(RuntimeError):  # its executor already shut down
            b.executor.submit(_close_handle, h)  # after the operation, on its thread

    def _unknown(self, sandbox_id: str, handle: str) -> AgentboxError:
        why = self._closed.get((sandbox_id, handle))
        if why is not None:
            return BrowserHandleNotFound(
                f"browser handle {handle} is closed: {why}; open the page again with "
                "browser_open (without a handle)"
            )
        return BrowserHandleNotFound(
            f"no browser handle {handle} in this sandbox; call browser_open without a handle "
            "to open a page"
        )

    def _remember(self, sandbox_id: str, handle: str, why: str) -> None:
        self._closed[(sandbox_id, handle)] = why
        while len(self._closed) > 1024:
            del self._closed[next(iter(self._closed))]

    def _reap_idle(self) -> None:
        """Close handles idle for ``idle_timeout``; a browser goes with its last handle."""
        while True:
            idle = self.config.idle_timeout
            if self._stop.wait(max(0.05, min(5.0, idle / 4))):
                return
            now = time.monotonic()
            closing: list[tuple[_Browser, _Handle]] = []
            ending: list[_Browser] = []
            with self._lock:
                for b in list(self._browsers.values()):
                    if b.ended and not any(h.busy for h in b.handles.values()):
                        self._retire(b)  # crashed or killed: nothing left to close gently
                        continue
                    reaped = [
                        h for h in b.handles.values() if h.busy == 0 and now - h.last_used >= idle
                    ]
                    for h in reaped:
                        del b.handles[h.id]
                        why = f"it was idle for {idle:g} s (the idle timeout)"
                        self._remember(b.sandbox_id, h.id, why)
                    if reaped and not b.handles:
                        del self._browsers[b.sandbox_id]
                        ending.append(b)  # closing the browser closes its contexts
                    else:
                        closing += [(b, h) for h in reaped]
            for b, h in closing:
                with contextlib.suppress(RuntimeError):  # its executor already shut down
                    b.executor.submit(_close_handle, h)
            for b in ending:
                b.executor.submit(self._shutdown, b)
                b.executor.shutdown(wait=False)


# helpers, all run on a browser's thread -----------------------------------------------
def check_url(url: str) -> None:
    scheme = url.partition(":")[0].lower()
    if ":" not in url or scheme not in URL_SCHEMES:
        raise InvalidRequest(
            f"cannot open {url[:100]!r}: give an absolute URL (http://, https://, file://, "
            "about:, data:)"
        )


def check_blocked(network: NetworkSpec, block_domains: tuple[str, ...]) -> None:
    """Fail closed: a sandbox made without the gateway (CLI, SDK) lacks block_domains."""
    missing = []
    for pattern in block_domains:
        try:
            normal = normalize_pattern(pattern)
        except AgentboxError:
            normal = pattern
        if normal not in network.deny:
            missing.append(pattern)
    if missing:
        raise PolicyDenied(
            f"this sandbox's network does not deny {', '.join(missing)} (browser.open "
            "block_domains); use a sandbox created through the gateway",
            rule="browser.open.block_domains",
        )


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise SandboxError("the browser returned something that is not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _page(h: _Handle) -> Page:
    if h.page is None or h.page.is_closed():
        raise BrowserHandleNotFound(
            f"the page of {h.id} is closed; open it again with browser_open (handle {h.id})"
        )
    return h.page


def _watch(h: _Handle, page: Page) -> None:
    def navigated(frame: Any) -> None:
        if frame == page.main_frame:
            h.navigations += 1

    page.on("framenavigated", navigated)


def _where(h: _Handle) -> dict[str, Any]:
    page = _page(h)
    return {"handle": h.id, "url": page.url, "title": page.title()}


def _settle(page: Page) -> None:
    from playwright.sync_api import Error as PlaywrightError

    with contextlib.suppress(PlaywrightError):
        page.wait_for_load_state("load", timeout=_SETTLE_MS)


def _after_action(h: _Handle, navigations_before: int) -> dict[str, Any]:
    navigated = h.navigations != navigations_before
    if navigated:
        _settle(_page(h))
    return {**_where(h), "navigated": navigated}


def _text(page: Page, max_chars: int) -> tuple[str, bool]:
    raw = page.evaluate(_TEXT_JS) or ""
    lines = [line.rstrip() for line in str(raw).splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return text[:max_chars], len(text) > max_chars


def _ref(page: Page, ref: str) -> Locator:
    if not REF.match(ref):
        raise InvalidRequest(f"{ref!r} is not a ref; refs look like e12 (from browser_snapshot)")
    locator = page.locator(f"aria-ref={ref}")
    if locator.count() == 0:
        raise BrowserRefNotFound(
            f"ref {ref} is not on the page (refs end when the page navigates or changes); "
            "take a new browser_snapshot and use a ref from it"
        )
    return locator


@contextlib.contextmanager
def _action_errors(target: str, action: str) -> Iterator[None]:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        yield
    except PlaywrightTimeout as e:
        raise CommandTimeout(
            f"could not {action} {target} in time ({_first_line(e)}); it may be hidden or "
            "disabled: take a new browser_snapshot"
        ) from None
    except PlaywrightError as e:
        message = _first_line(e)
        if "Unknown key" in message:
            raise InvalidRequest(
                f"{message}; use key names like Enter, Tab, ArrowDown, Control+A"
            ) from None
        if "not an <input>" in message or "not a <select>" in message:
            raise InvalidRequest(
                f"cannot {action} {target}: {message}; pick a textbox, searchbox or combobox "
                "ref from browser_snapshot"
            ) from None
        raise


def _close_handle(h: _Handle) -> None:
    if h.context is not None:
        with contextlib.suppress(Exception):
            h.context.close()
    h.context = h.page = None


def _navigation_error(e: Exception, url: str) -> AgentboxError:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    message = _first_line(e)
    if isinstance(e, PlaywrightTimeout):
        return CommandTimeout(f"{url} did not load in time ({message}); try again later")
    hint = ""
    if "ERR_TUNNEL_CONNECTION_FAILED" in message or "ERR_PROXY" in message:
        hint = "; the sandbox's egress policy refused the host or it is unreachable"
    return NavigationFailed(f"could not load {url}: {message}{hint}")


def _ended(b: _Browser) -> AgentboxError:
    return SandboxError(
        f"the sandbox's browser is gone ({b.ended}); open the page again with browser_open "
        "(without a handle)"
    )


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "message", None) or e).strip()
    return (text.splitlines() or [""])[0][:500]


def _launch_log(e: BaseException) -> str:
    """The useful part of Playwright's launch error: what the process printed."""
    text = str(getattr(e, "message", None) or e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    useful = [ln for ln in lines if "agentbox" in ln or "error" in ln.lower()]
    return "; ".join((useful or lines)[:6])[:1500]
