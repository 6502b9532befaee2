"""``vllm-sim``: a command line that mirrors ``vllm serve`` where vLLM has the flag, plus ``--sim-*`` flags.

Environment, read as vLLM reads it: ``PYTHONHASHSEED`` (the NONE_HASH seed) and
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (``0`` sends raw 32-byte digests in events).
Unknown ``vllm serve`` flags are ignored with a warning, so existing launch scripts work unchanged.
Prints one ``vllm-sim: serving <model> on http://host:port`` line per server, then ``vllm-sim: ready``;
exits cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from vllm_sim.cluster import SimCluster
from vllm_sim.config import KVEventsConfig, ServerConfig, SimOptions
from vllm_sim.engine import EngineConfig
from vllm_sim.hashing import HASH_ALGOS, LoraKey, none_hash_seed
from vllm_sim.pd import KvTransferConfig, TransferModel
from vllm_sim.scheduler import SchedulerConfig
from vllm_sim.timing import DEFAULT_PROFILE, PROFILES, get_profile

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"


def _vllm_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model name (alternative to the positional)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (vLLM's default is all interfaces)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port of server 0 (0: pick a free port)")
    p.add_argument("--served-model-name", nargs="+", default=None, help="names clients use (default: model)")
    p.add_argument("--tokenizer", default=None, help="local tokenizer folder (default: tokenizer_cache/<model>)")
    p.add_argument("--block-size", type=int, default=16, help="KV block size in tokens")
    p.add_argument("--num-gpu-blocks-override", type=int, default=None, help="KV capacity in blocks")
    p.add_argument("--max-num-seqs", type=int, default=1024, help="max running requests (vLLM on H100: 1024)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget per step")
    p.add_argument("--max-model-len", type=int, default=32768, help="max prompt + output tokens")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--prefix-caching-hash-algo", choices=HASH_ALGOS, default="sha256")
    p.add_argument("--kv-events-config", default=None, help="JSON with vLLM's KVEventsConfig keys")
    p.add_argument("--kv-transfer-config", default=None,
                   help='vLLM\'s JSON, e.g. {"kv_connector": "NixlConnector"}: serve P/D legs')  # fmt: skip
    p.add_argument("--lora-modules", nargs="+", default=[], help="name=path or JSON {name, path}")
    p.add_argument("--enable-lora", action="store_true", help="accepted for compatibility")
    p.add_argument("--max-loras", type=int, default=1, help="distinct adapters per batch")
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens (off by default, as vLLM)",
    )


def _more_vllm_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream-interval", type=int, default=1, help="tokens per streamed chunk (after the first)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="serve tool_choice auto/required/named (with --tool-call-parser; else 400s)")  # fmt: skip
    p.add_argument("--tool-call-parser", default=None,
                   help="any name (the simulator's filler text holds no tool call to parse)")  # fmt: skip


def _tool_call_parser(args: argparse.Namespace) -> str | None:
    """vLLM's rule: ``--enable-auto-tool-choice`` needs ``--tool-call-parser``; a parser alone enables nothing."""
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
    return args.tool_call_parser if args.enable_auto_tool_choice else None


def _sim_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("simulator-only")
    g.add_argument("--sim-profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE, help="timing profile")
    g.add_argument("--sim-prefill-tokens-per-s", type=float, default=None, help="override: prefill throughput")
    g.add_argument("--sim-decode-step-s", type=float, default=None, help="override: fixed time per step")
    g.add_argument("--sim-decode-per-seq-s", type=float, default=None, help="override: step growth per sequence")
    g.add_argument("--sim-time-scale", type=float, default=1.0, help="multiply every step duration")
    g.add_argument("--sim-num-servers", type=int, default=1, help="servers in this process (ports port..port+K-1)")
    g.add_argument("--sim-output-len", type=int, default=128, help="tokens until the simulated EOS")
    g.add_argument(
        "--sim-legacy-kv-events",
        action="store_true",
        help="array-form events (vLLM <= 0.23) and topic-less replay frames (<= 0.25)",
    )
    g.add_argument(
        "--sim-kv-events-bind",
        action="store_true",
        help="bind the KV-event PUB socket even for host endpoints (vLLM would connect to tcp://host:port)",
    )
    g.add_argument("--sim-pd-sidecar", action="store_true",
                   help="llm-d's decode sidecar: x-prefiller-host-port runs the prefill leg there first")  # fmt: skip
    g.add_argument("--sim-kv-transfer-gbps", type=float, default=25.0, help="P/D KV transfer bandwidth, GB/s")
    g.add_argument("--sim-kv-bytes-per-token", type=int, default=131_072, help="K+V bytes per token (transfer)")
    g.add_argument("--sim-token-cache-tokens", type=int, default=SimOptions().token_cache_tokens,
                   help="tokens the tokenizer's result cache holds (one cache per process)")  # fmt: skip
    g.add_argument("--sim-log-level", default="WARNING", help="Python logging level")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-sim",
        usage="vllm-sim [MODEL] [options]",
        description="A vLLM-compatible simulator (no GPU).",
        allow_abbrev=False,  # an unknown vLLM flag must never be taken for an abbreviation of ours
    )
    _vllm_flags(p)
    _more_vllm_flags(p)
    _sim_flags(p)
    return p


def _dashed(arg: str) -> str:
    """vLLM accepts ``--max_model_len``: underscores in a flag's name (not its value) become dashes."""
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg.partition("=")
    return name.replace("_", "-") + sep + value


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Parse flags; a leading non-flag word is the model (``vllm serve MODEL``). Returns unknown flags too."""
    rest = [_dashed(a) for a in argv]
    model_tag = rest.pop(0) if rest and not rest[0].startswith("-") else None
    args, unknown = build_parser().parse_known_args(rest)
    args.model_tag = model_tag
    return args, unknown


def parse_lora(specs: Sequence[str]) -> tuple[LoraKey, ...]:
    """``name=path`` or ``{"name": ..., "path": ...}``; int ids from 1 in order, as vLLM assigns them."""
    out: list[LoraKey] = []
    for i, spec in enumerate(specs, start=1):
        if spec.lstrip().startswith("{"):
            raw = json.loads(spec)
            name, path = str(raw["name"]), str(raw["path"])
        else:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules expects name=path, got {spec!r}")
        out.append(LoraKey(name=name, path=path, int_id=i))
    return tuple(out)


def _engine_config(args: argparse.Namespace, environ: Mapping[str, str], events: bool) -> EngineConfig:
    profile = get_profile(args.sim_profile)
    blocks = args.num_gpu_blocks_override or profile.kv_capacity_tokens // args.block_size + 1
    if args.max_model_len > (blocks - 1) * args.block_size:
        raise ValueError(f"--max-model-len {args.max_model_len} exceeds the KV capacity of {blocks - 1} blocks")
    return EngineConfig(
        block_size=args.block_size,
        num_gpu_blocks=blocks,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        hash_algo=args.prefix_caching_hash_algo,
        hash_seed=none_hash_seed(environ),
        scheduler=SchedulerConfig(args.max_num_seqs, args.max_num_batched_tokens, args.max_loras),
        record_events=events,
        time_scale=args.sim_time_scale,
    )


def _tokenizer_dir(flag: str | None, model: str) -> Path:
    path = Path(flag) if flag else Path("tokenizer_cache") / model
    if not (path / "tokenizer_config.json").is_file():
        raise ValueError(f"no tokenizer at {path} (pass --tokenizer <local folder>)")
    return path


def build_config(args: argparse.Namespace, environ: Mapping[str, str]) -> ServerConfig:
    """Resolve parsed flags and the environment into server 0's config; raises ValueError on bad values."""
    model = args.model or getattr(args, "model_tag", None) or DEFAULT_MODEL
    kv_events = KVEventsConfig.from_json(args.kv_events_config) if args.kv_events_config else KVEventsConfig()
    timing = get_profile(args.sim_profile).with_overrides(
        args.sim_prefill_tokens_per_s, args.sim_decode_step_s, args.sim_decode_per_seq_s
    )
    return ServerConfig(
        host=args.host,
        port=args.port,
        model=model,
        served_model_names=tuple(args.served_model_name or [model]),
        tokenizer=_tokenizer_dir(args.tokenizer, model),
        engine=_engine_config(args, environ, kv_events.active),
        timing=timing,
        kv_events=kv_events,
        kv_transfer=KvTransferConfig.from_json(args.kv_transfer_config),
        lora_modules=parse_lora(args.lora_modules),
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        stream_interval=max(args.stream_interval, 1),
        tool_call_parser=_tool_call_parser(args),
        sim=SimOptions(
            output_len=args.sim_output_len,
            legacy_events=args.sim_legacy_kv_events,
            use_int_block_hashes=environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0",
            kv_events_bind=args.sim_kv_events_bind,
            pd_sidecar=args.sim_pd_sidecar,
            transfer=TransferModel(gbps=args.sim_kv_transfer_gbps, bytes_per_token=args.sim_kv_bytes_per_token),
            token_cache_tokens=args.sim_token_cache_tokens,
        ),
    )


def config_from_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Server 0's config from ``vllm-sim`` arguments, for embedding; unknown flags raise ValueError."""
    args, unknown = parse_args(argv)
    if unknown:
        raise ValueError(f"unknown vllm-sim flags: {' '.join(unknown)}")
    return build_config(args, {} if environ is None else environ)


async def serve(config: ServerConfig, n: int) -> None:
    """Run ``n`` servers until SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with SimCluster(config, n) as cluster:
        for server in cluster.servers:
            print(f"vllm-sim: serving {config.model_name} on {server.url}", flush=True)
        print(f"vllm-sim: ready ({n} server{'s' if n > 1 else ''})", flush=True)
        await stop.wait()
    print("vllm-sim: stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    parser = build_parser()
    args, unknown = parse_args(sys.argv[1:] if argv is None else argv)
    if unknown:
        print(f"vllm-sim: ignoring unsupported vLLM flags: {' '.join(unknown)}", file=sys.stderr)
    logging.basicConfig(level=args.sim_log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args, os.environ)
    except (ValueError, KeyError, json.JSONDecodeError) as exc:
        parser.error(str(exc))
    try:
        asyncio.run(serve(config, args.sim_num_servers))
    except OSError as exc:  # a port in use, an endpoint that cannot bind
        print(f"vllm-sim: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0
