"""The browser's pure parts: Chromium's argument rewrite, the compact snapshot, URLs, PNGs."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from agentbox.browser import launch as launch_module
from agentbox.browser.launch import (
    DISABLED_FEATURES,
    REQUIRED_FLAGS,
    build_argv,
    chromium_args,
    launcher_script,
)
from agentbox.browser.manager import check_url, png_size
from agentbox.browser.snapshot import compact
from agentbox.errors import InvalidRequest, SandboxError

PLAYWRIGHT_ARGS = [
    "--disable-field-trial-config",
    "--disable-features=HttpsUpgrades,MediaRouter,PaintHolding",
    "--headless",
    "--no-sandbox",
    "--user-data-dir=/tmp/playwright_chromiumdev_profile-abc",
    "--remote-debugging-pipe",
    "--proxy-server=http://evil.example:1",
    "--gaia-url=https://accounts.google.com",
    "--no-startup-window",
]


def test_chromium_args_keep_playwrights_and_enforce_ours() -> None:
    args = chromium_args(
        PLAYWRIGHT_ARGS, "/tmp/.agentbox-browser-x/profile", "http://10.0.0.1:3128"
    )
    assert "--remote-debugging-pipe" in args and "--headless" in args
    for flag in REQUIRED_FLAGS:
        assert args.count(flag) == 1, flag
    assert [a for a in args if a.startswith("--user-data-dir=")] == [
        "--user-data-dir=/tmp/.agentbox-browser-x/profile"
    ]
    assert [a for a in args if a.startswith("--proxy-server=")] == [
        "--proxy-server=http://10.0.0.1:3128"
    ]
    assert "--gaia-url=https://accounts.google.com" not in args
    features = [a for a in args if a.startswith("--disable-features=")]
    assert len(features) == 1  # Chromium keeps only the last one: one merged list
    names = features[0].partition("=")[2].split(",")
    assert {"HttpsUpgrades", "PaintHolding", *DISABLED_FEATURES} <= set(names)
    assert len(names) == len(set(names))


def test_chromium_args_without_network_have_no_proxy() -> None:
    args = chromium_args(PLAYWRIGHT_ARGS, "/tmp/p", None)
    assert not [a for a in args if a.startswith("--proxy")]


def test_build_argv_appends_chromium_after_the_launcher() -> None:
    spec = {
        "nsexec_argv": ["/lib/nsexec", "enter", "--keep-fds", "2", "--leaf", "x", "--"],
        "chromium": "/usr/lib/chromium/chromium",
        "user_data_dir": "/tmp/p",
        "proxy": None,
        "env": {},
    }
    argv = build_argv(spec, ["--headless"])
    assert argv[:8] == [*spec["nsexec_argv"], "/usr/lib/chromium/chromium"]
    assert "--headless" in argv[8:]
    with pytest.raises(ValueError):
        build_argv({**spec, "nsexec_argv": ["/lib/nsexec", "enter"]}, [])


def test_launcher_script_is_root_owned_and_stable(tmp_path: Path) -> None:
    first = launcher_script(tmp_path)
    assert launcher_script(tmp_path) == first
    assert first.stat().st_mode & 0o777 == 0o755
    text = first.read_text()
    assert (
        text.startswith("#!/bin/sh\nexec ")
        and f"-I '{Path(launch_module.__file__).resolve()}'" in text
    )


RAW = """- generic [active] [ref=e1]:
  - navigation "Main" [ref=e2]:
    - link "Home" [ref=e3] [cursor=pointer]:
      - /url: /a
    - 'link "Say \\"hi\\": now" [ref=e4]':
      - /url: /b
  - main [ref=e5]:
    - heading "Hello" [level=1] [ref=e6]
    - paragraph [ref=e7]: Some text
    - generic [ref=e9]:
      - text: Search
      - textbox "Search" [ref=e10]
    - checkbox "Check" [checked] [ref=e11]
    - combobox [ref=e12]:
      - option "one" [selected]
    - iframe [ref=e20]:
      - button "inner" [ref=f1e2]
"""


def test_compact_keeps_landmarks_and_controls_with_refs() -> None:
    snap = compact(RAW, 10_000)
    assert snap.text.splitlines() == [
        '- navigation "Main" [ref=e2]',
        '  - link "Home" [ref=e3] -> /a',
        '  - link "Say \\"hi\\": now" [ref=e4] -> /b',
        "- main [ref=e5]",
        '  - heading "Hello" [level=1] [ref=e6]',
        '  - textbox "Search" [ref=e10]',
        '  - checkbox "Check" [checked] [ref=e11]',
        "  - combobox [ref=e12]",
        "  - iframe [ref=e20]",
        '    - button "inner" [ref=f1e2]',
    ]
    assert [e.ref for e in snap.elements][:3] == ["e2", "e3", "e4"]
    assert snap.elements[2].name == 'Say "hi": now'
    assert not snap.truncated


def test_compact_truncates_at_whole_lines_and_survives_garbage() -> None:
    snap = compact(RAW, 60)
    assert (
        snap.truncated
        and snap.text == '- navigation "Main" [ref=e2]\n  - link "Home" [ref=e3] -> /a'
    )
    odd = compact("not: [valid", 100)
    assert odd.text == "not: [valid" and odd.elements == ()


@pytest.mark.parametrize("url", ["http://a.test/", "https://a.test/x?y", "about:blank", "data:,x"])
def test_urls_that_open(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "a.test", "chrome://settings", "view-source:x"]
)
def test_urls_that_do_not(url: str) -> None:
    with pytest.raises(InvalidRequest):
        check_url(url)


def test_png_size_reads_ihdr() -> None:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 640, 400, 8, 6, 0, 0, 0))
    assert png_size(png) == (640, 400)
    with pytest.raises(SandboxError):
        png_size(b"GIF89a" + b"\0" * 30)


def test_chromium_args_trust_only_our_egress_ca_key() -> None:
    given = [*PLAYWRIGHT_ARGS, "--ignore-certificate-errors-spki-list=someone-elses"]
    args = chromium_args(given, "/tmp/p", "http://10.204.0.1:3128", "b64spki=")
    spki = [a for a in args if a.startswith("--ignore-certificate-errors-spki-list=")]
    assert spki == ["--ignore-certificate-errors-spki-list=b64spki="]
    assert not any(a.startswith("--ignore-certificate-errors-spki-list") for a in
                   chromium_args(given, "/tmp/p", None))  # fmt: skip


def test_a_runsc_spec_puts_chromium_after_the_relay_shell() -> None:
    process = {"args": ["/usr/bin/unshare", "--pid", "--", "/bin/sh", "-c", "relay", "sh"]}
    spec = {
        "runsc_argv": ["/usr/bin/runsc", "exec", "--process=/x.json", "sb-1"],
        "process": process,
        "process_file": "/x.json",
        "chromium": "/usr/lib/chromium/chromium",
        "user_data_dir": "/tmp/p",
        "env": {"PATH": "/usr/bin"},
    }
    argv = build_argv(spec, ["--headless"])
    assert argv[: len(process["args"]) + 1] == [*process["args"], "/usr/lib/chromium/chromium"]
    assert "--headless" in argv and "--user-data-dir=/tmp/p" in argv
