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
        dest = tc.add_from_dir(root, args.model, tc.package_folder(args.from_package))
    else:
        dest = tc.add_from_hub(root, args.model)
    print(f"tokenizer for {args.model} in {dest}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="extproc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

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
