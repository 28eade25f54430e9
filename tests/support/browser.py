"""The real browser of the playground's tests: Debian's Chromium driven by Playwright (the pip
package, pinned in the `test` extras), never a browser Playwright downloads. Without the browser
the tests skip, and the run says once how to install it (tests/server/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

CHROMIUM = "/usr/bin/chromium"
INSTALL = "sudo apt-get install -y chromium"  # the README's one documented line (and .ci/run's)
SKIP_PREFIX = "playground browser tests skipped"
# headless Chromium plays audio without a click only with this policy; the page itself starts
# its AudioContext in the click that asks for speech, as browsers require of real pages
LAUNCH_ARGS = ["--autoplay-policy=no-user-gesture-required"]


def missing() -> str | None:
    """Why the browser tests cannot run here (one line saying how to fix it), or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{SKIP_PREFIX}: no Chromium at {CHROMIUM}; install it with `{INSTALL}`"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f'{SKIP_PREFIX}: no Playwright; install the test extras: pip install -e ".[test]"'
    return None


@contextmanager
def chromium() -> Iterator:
    """A headless Chromium (Playwright's Browser) for the length of the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()
