"""Free TCP ports on 127.0.0.1 for processes a test starts (the stack launcher's helper, one copy)."""

from __future__ import annotations

from bench.procs import free_ports


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (the OS chose it; others may still race for it)."""
    return free_ports(1)[0]


__all__ = ["free_port", "free_ports"]
