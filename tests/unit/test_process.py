"""The process mains' settings: the start-up heap is frozen once, after the warm-up, before readiness."""

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
