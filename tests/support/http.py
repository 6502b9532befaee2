"""Small blocking HTTP probes for tests that wait on real processes."""

from __future__ import annotations

import urllib.request


def http_ok(url: str, timeout_s: float = 0.5) -> bool:
    """True when ``GET url`` answers 200 within ``timeout_s``; False on any other answer or error."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
