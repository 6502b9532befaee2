#!/usr/bin/env python3
"""Generate the ext_proc Python stubs from ``protos/`` with the pinned grpcio-tools.

Usage: ``python scripts/gen_protos.py [OUT_DIR]`` (default: the repo root). The stubs land in
``OUT_DIR/extproc/protocol/pb/`` and import each other as ``extproc.protocol.pb.<name>_pb2``.
tests/protocol/test_stubs_fresh.py regenerates into a temp dir and compares with the committed files.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = Path("extproc/protocol/pb")


def proto_files() -> list[str]:
    """Our .proto files, relative to ``protos/`` (which is also their import root)."""
    return sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def generate(out_dir: Path) -> None:
    """Run protoc (python, pyi and grpc outputs) over every proto; raise on failure."""
    (out_dir / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    well_known = str(resources.files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *proto_files(),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else ROOT
    generate(out_dir)
    print(f"generated {len(proto_files())} protos into {out_dir / PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
