"""Free TCP ports on 127.0.0.1 for processes a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (the OS chose it; others may still race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports, all held open together while choosing so none repeats."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
