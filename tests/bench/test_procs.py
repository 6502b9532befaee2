"""``ManagedProcess``: a Python child that never gets ready leaves its threads' stacks in the start error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.procs import ManagedProcess, ProcessStartError

HANGS = """
import threading, time
def waiting_for_a_tokenizer():
    time.sleep(600)
threading.Thread(target=waiting_for_a_tokenizer, name="loader", daemon=True).start()
print("started", flush=True)
time.sleep(600)
"""


def test_a_python_child_that_never_gets_ready_shows_where_each_thread_waits(tmp_path: Path) -> None:
    proc = ManagedProcess("hangs", [sys.executable, "-c", HANGS], tmp_path / "hangs.log")
    with pytest.raises(ProcessStartError) as failed:
        proc.start(lambda: False, timeout_s=5.0)  # ample for the child to reach its sleeps
    message = str(failed.value)
    assert "not ready after 5.0s" in message
    assert "waiting_for_a_tokenizer" in message  # the other thread's stack, not only the main one's
    assert not proc.running
    assert not list(tmp_path.glob("core*"))
