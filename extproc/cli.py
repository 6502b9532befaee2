"""``extproc``: the router's command line. Subcommands import their dependencies lazily."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _tokenizers(args: argparse.Namespace) -> int:
    from extproc.prompt import tokenizer_cache as tc

    root = Path(args.cache_dir)
    if args.from_dir:
        dest = tc.add_from_dir(root, args.model, Path(args.from_dir))
    elif args.from_package:
        dest = tc.add_from_package(root, args.model, args.from_package)
    else:
        dest = tc.add_from_hub(root, args.model)
    print(f"tokenizer for {args.model} in {dest}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from extproc import process
    from extproc.app import App
    from extproc.config import load_config

    config = load_config(args.config)
    logging.basicConfig(level=config.logging.level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    process.configure(config)  # process-wide: set by the process's main only

    async def run() -> None:
        base_dir = Path(args.config).resolve().parent if args.relative else None
        app = App(config, base_dir=base_dir, before_ready=process.freeze_startup_heap)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await app.start()
        print(
            f"extproc: ready on {config.listen.host}:{app.grpc_port} (metrics :{app.metrics_port})"
            + ("" if app.authz_port is None else f" (authz :{app.authz_port})"),
            flush=True,
        )
        await stop.wait()
        await app.stop()

    asyncio.run(run())
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from extproc.diagnostics.diagnose import run

    return run(args)


def _add_diagnose(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("diagnose", help="prefix-stability report over a JSONL of requests or a trace")
    p.add_argument("input", help="JSONL: OpenAI request bodies, {body, tenant} rows, or trace rows (hash_ids)")
    p.add_argument("--model", help="tokenizer to use (default: each body's model); names trace streams")
    p.add_argument("--tokenizer-cache", default="tokenizer_cache", help="folder of per-model tokenizers")
    p.add_argument("--block-size", type=int, default=16, help="the engines' KV block size (vLLM's default 16)")
    p.add_argument("--trace-block-tokens", type=int, default=512, help="tokens per trace hash id (Mooncake: 512)")
    p.add_argument("--limit", type=int, default=0, help="diagnose at most this many requests (0: all)")
    p.add_argument("--plot", default="prefix-stability.svg", help="plot file: .svg, or .png (matplotlib); '': none")
    p.add_argument("--log-prompts", action="store_true", help="also print an example span's text (prompt text)")
    p.set_defaults(func=_diagnose)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="extproc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the ext_proc picker")
    serve.add_argument("--config", required=True, help="YAML config file (see extproc/config.py)")
    serve.add_argument(
        "--relative",
        action="store_true",
        help="resolve tokenizer_cache_dir against the config file's folder, not the cwd",
    )
    serve.set_defaults(func=_serve)

    tok = sub.add_parser("tokenizers", help="manage tokenizer_cache/")
    tok_sub = tok.add_subparsers(dest="tok_command", required=True)
    add = tok_sub.add_parser("add", help="put a model's tokenizer into tokenizer_cache/<model>/")
    add.add_argument("model", help="served model name, e.g. Qwen/Qwen3-0.6B")
    src = add.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-dir", help="a local folder with tokenizer.json / tokenizer_config.json")
    src.add_argument("--from-package", help="an installed pip package that ships tokenizer files")
    src.add_argument("--from-hub", action="store_true", help="download from the Hugging Face hub")
    add.add_argument("--cache-dir", default="tokenizer_cache")
    add.set_defaults(func=_tokenizers)

    _add_diagnose(sub)

    from extproc.envoy.command import add_parser as add_envoy_config

    add_envoy_config(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (FileNotFoundError, ValueError) as exc:
        print(f"extproc: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
