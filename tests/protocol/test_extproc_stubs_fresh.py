"""The committed stubs under extproc/protocol/pb/ are exactly what scripts/gen_protos.py generates now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PB = Path("extproc/protocol/pb")


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts/gen_protos.py"), str(tmp_path)], check=True, timeout=120)
    fresh = {p.name: p.read_bytes() for p in (tmp_path / PB).iterdir() if p.is_file()}
    committed = {p.name: p.read_bytes() for p in (ROOT / PB).iterdir() if p.is_file() and p.name != "__init__.py"}
    assert sorted(fresh) == sorted(committed), "run: python scripts/gen_protos.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale stubs {stale}; run: python scripts/gen_protos.py"
