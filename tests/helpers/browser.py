"""Headless Chromium for the browser tests: where it lives, how it starts, and the skip when it is missing."""
from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# CI sets SPECLENS_REQUIRE_BROWSER=1: there a missing Chromium fails instead of skipping
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("SPECLENS_REQUIRE_BROWSER"),
    reason=f"Debian's Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
