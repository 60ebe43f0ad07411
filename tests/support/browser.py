"""Headless Chromium for the page tests: Debian's `chromium` (installed by .ci/run when
missing), driven through Playwright's Python package, whose own browser download is never
used. The page opens from disk with the browser context offline, and every request that
is not to a file is recorded, so a test can say the page needed no network."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

#: The flags this workplace's Chromium needs (no sandbox as root, no background traffic).
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip(
            "Chromium is not installed here (Debian: apt-get install chromium; .ci/run installs it), "
            "so the page cannot be opened in a real browser"
        )
    return path


@dataclass
class PageReport:
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    network: list[str] = field(default_factory=list)  # requests to anything but a file


@contextmanager
def open_page(
    path: Path, *, ready: str, width: int = 1400, height: int = 1000
) -> Iterator[tuple[Page, PageReport]]:
    """`path` in headless Chromium, offline, once the JavaScript expression `ready` is true."""
    report = PageReport()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=require_chromium(), args=CHROMIUM_FLAGS, headless=True
        )
        try:
            context = browser.new_context(viewport={"width": width, "height": height}, offline=True)
            page = context.new_page()
            page.on(
                "console",
                lambda m: report.console_errors.append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: report.page_errors.append(str(e)))
            page.on(
                "request",
                lambda r: (
                    None
                    if r.url.startswith(("file:", "data:", "about:"))
                    else report.network.append(r.url)
                ),
            )
            page.goto(path.resolve().as_uri())
            page.wait_for_function(ready, timeout=60_000)
            yield page, report
        finally:
            browser.close()
