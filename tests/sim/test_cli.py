"""The command line: flag parsing into config, and the real console entry point as a subprocess."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.sim.helpers import REPO, TOKENIZER_DIR, sim_config
from vllm_sim.cli import parse_args, parse_lora
from vllm_sim.config import KVEventsConfig, offset_endpoint
from vllm_sim.hashing import LoraKey


def test_flags_resolve_like_vllm_serve() -> None:
    cfg = sim_config(
        "--served-model-name", "a", "b", "--block-size", "64", "--num-gpu-blocks-override", "100",
        "--max-num-seqs", "7", "--max-num-batched-tokens", "512", "--max-model-len", "1024",
        "--no-enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor",
        env={"PYTHONHASHSEED": "0", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"},
    )  # fmt: skip
    e = cfg.engine
    assert cfg.served_model_names == ("a", "b") and cfg.model_name == "a"
    assert (e.block_size, e.num_gpu_blocks, e.max_model_len) == (64, 100, 1024)
    assert (e.scheduler.max_num_seqs, e.scheduler.max_num_batched_tokens) == (7, 512)
    assert (e.enable_prefix_caching, e.hash_algo, e.hash_seed) == (False, "sha256_cbor", "0")
    assert cfg.sim.use_int_block_hashes is False
    assert sim_config().engine.hash_seed == "vllm-none-hash"


def test_model_positional_and_unknown_vllm_flags() -> None:
    args, unknown = parse_args(
        ["Qwen/Qwen3-0.6B", "--gpu-memory-utilization", "0.9", "--port", "9", "--max_model_len=77", "--max-num", "3"]
    )
    assert args.model_tag == "Qwen/Qwen3-0.6B" and args.port == 9 and args.max_model_len == 77
    assert unknown == ["--gpu-memory-utilization", "0.9", "--max-num", "3"]  # no abbreviations of our flags


def test_kv_events_config_keys_defaults_and_offsets() -> None:
    cfg = KVEventsConfig.from_json('{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:6557"}')
    assert cfg.publisher == "zmq" and cfg.endpoint == "tcp://*:5557" and cfg.buffer_steps == 10000
    assert KVEventsConfig().publisher == "null"
    assert cfg.for_index(2).endpoint == "tcp://*:5559" and cfg.for_index(2).replay_endpoint == "tcp://*:6559"
    assert offset_endpoint("tcp://*:0", 3) == "tcp://*:0"
    assert offset_endpoint("inproc://kv", 1) == "inproc://kv_dp1"
    with pytest.raises(ValueError, match="unknown"):
        KVEventsConfig.from_json('{"enable": true}')


def test_lora_modules_both_forms() -> None:
    assert parse_lora(["a=/p/a", '{"name": "b", "path": "/p/b"}']) == (
        LoraKey("a", "/p/a", 1),
        LoraKey("b", "/p/b", 2),
    )
    with pytest.raises(ValueError):
        parse_lora(["nopath"])


def _read_quietly(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with contextlib.suppress(OSError, http.client.HTTPException), urllib.request.urlopen(req, timeout=20) as resp:
        resp.read()


def test_console_entry_serves_and_exits_cleanly_on_sigterm() -> None:
    cmd = [sys.executable, "-m", "vllm_sim", "--port", "0", "--sim-profile", "fast", "--tokenizer", str(TOKENIZER_DIR)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and "serving" not in line:
            line = proc.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:"), line
        assert "ready" in proc.stdout.readline()
        req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps({"prompt": "Hi"}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 16
        stream = json.dumps({"prompt": "Hi", "max_tokens": 100000, "ignore_eos": True, "stream": True}).encode()
        streaming = threading.Thread(target=_read_quietly, args=(f"{url}/v1/completions", stream), daemon=True)
        streaming.start()  # a stream still open at SIGTERM must not hold the exit up
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        streaming.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
