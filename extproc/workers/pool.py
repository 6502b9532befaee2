"""The main process's front workers: start N, wait until each is ready, restart one that dies, stop them all.

Each front is ``python -m extproc.workers.front`` (see there), started with ``PR_SET_PDEATHSIG`` so that it
gets SIGTERM if the main process dies without stopping it (it also exits when the decider's socket closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import sys
from collections.abc import Callable

from extproc.tasks import stop_task

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0  # a front that keeps dying is restarted at most this often
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class FrontPool:
    """``count`` front processes, each started by ``argv_for(index)``; ``ready(index)`` is told by the decider
    server when a front says so."""

    def __init__(self, count: int, argv_for: Callable[[int], list[str]], *, start_timeout_s: float) -> None:
        self._count = count
        self._argv_for = argv_for
        self._start_timeout_s = start_timeout_s
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._watchers: dict[int, asyncio.Task[None]] = {}
        self._ready: set[int] = set()
        self._all_ready = asyncio.Event()
        self._stopping = False
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values()]

    def ready(self, index: int) -> None:
        self._ready.add(index)
        if len(self._ready) >= self._count:
            self._all_ready.set()

    async def start(self) -> None:
        """Start every front and wait until all are ready. Raises ``RuntimeError`` (after stopping those that
        started) if one exits first or ``start_timeout_s`` passes."""
        for index in range(self._count):
            await self._spawn(index)
        try:
            async with asyncio.timeout(self._start_timeout_s):
                await self._all_ready.wait()
        except TimeoutError:
            missing = sorted(set(range(self._count)) - self._ready)
            await self.stop()
            raise RuntimeError(
                f"front workers {missing} not ready within {self._start_timeout_s}s (see their log lines)"
            ) from None

    async def _spawn(self, index: int) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self._argv_for(index), preexec_fn=_die_with_parent if sys.platform == "linux" else None
        )
        self._procs[index] = proc
        self._watchers[index] = asyncio.create_task(self._watch(index, proc), name=f"front-{index}")

    async def _watch(self, index: int, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self._ready.discard(index)
        if self._stopping:
            return
        log.warning("front worker %d (pid %d) exited with %s; restarting in %.0fs", index, proc.pid, code,
                    RESTART_DELAY_S)  # fmt: skip
        await asyncio.sleep(RESTART_DELAY_S)
        if not self._stopping:
            self.restarts += 1
            await self._spawn(index)

    async def stop(self) -> None:
        """SIGTERM every front, wait up to ``STOP_GRACE_S``, SIGKILL the rest."""
        self._stopping = True
        procs = list(self._procs.values())
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        waits = [asyncio.create_task(p.wait()) for p in procs]
        if waits:
            _, late = await asyncio.wait(waits, timeout=STOP_GRACE_S)
            for proc in procs:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            if late:
                await asyncio.wait(late)
        for watcher in self._watchers.values():
            await stop_task(watcher)
