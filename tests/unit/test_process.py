"""The process mains' settings: the start-up heap is frozen once, after the warm-up, before readiness; the C heap
keeps a long body's buffers for the next request."""

from __future__ import annotations

import subprocess
import sys

from extproc.app import App
from extproc.prompt.models import BaseModel
from tests.support.config import router_config


def test_freezing_moves_the_live_heap_out_of_later_collections() -> None:
    # in a child: freezing is for a process main, never for this test process
    code = "import gc; from extproc.process import freeze_startup_heap; freeze_startup_heap(); print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert int(out.stdout) > 1000


async def test_the_app_calls_before_ready_once_after_the_warm_up() -> None:
    config = router_config(listen={"host": "127.0.0.1", "grpc_port": 0, "metrics_port": None})
    seen: list[bool] = []
    app = App(config, before_ready=lambda: seen.append(
        app.preparer.tokenizers.loaded(BaseModel(config.models[0].name)) is not None
    ))  # fmt: skip
    await app.start()
    try:
        assert seen == [True], "called once, with the tokenizer loaded"
    finally:
        await app.stop()


def test_a_kept_heap_serves_the_next_long_body_without_page_faults() -> None:
    # in a child: heap thresholds are for a process main; each child allocates and frees 300 KB buffers 200 times
    code = (
        "import resource, sys\n"
        "from extproc.process import keep_heap\n"
        "took = keep_heap(int(sys.argv[1]))\n"
        "def one():\n"
        "    a = bytes(bytearray(300_000)); b = bytearray(a); c = bytes(b)\n"
        "    return len(c)\n"
        "for _ in range(20): one()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(200): one()\n"
        "print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )
    faults = {}
    for keep in (0, 64 << 20):
        out = subprocess.run([sys.executable, "-c", code, str(keep)], capture_output=True, text=True, timeout=60,
                             check=True)  # fmt: skip
        took, count = out.stdout.split()
        assert took == str(keep > 0)  # glibc here (Debian); 0 leaves its defaults
        faults[keep] = int(count)
    assert faults[0] > 200 * 50  # every round maps its buffers anew
    assert faults[64 << 20] < 200  # kept: at most a stray page now and then
