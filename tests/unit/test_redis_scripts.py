"""The Redis scripts ship as package data (``extproc/redis/lua/*.lua``) and render without placeholders left."""

from __future__ import annotations

import tomllib

import pytest

from bench.stack_config import REPO
from extproc.redis import scripts

LUA = sorted(p.stem for p in (REPO / "extproc" / "redis" / "lua").glob("*.lua"))


def test_an_install_carries_the_lua_files() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "lua/*.lua" in data["extproc.redis"]


@pytest.mark.parametrize(("name", "blob_arg"), [("match", 1), ("store", 4), ("remove", 2), ("clear", 3)])
def test_index_scripts_render_with_their_constants(name: str, blob_arg: int) -> None:
    text = scripts.index_script(name, blob_arg=blob_arg)
    assert f"ARGV[{blob_arg}]" in text
    for placeholder in ("ARGV[BLOB]", "CHUNK", "RECLAIM", "DRAIN"):
        assert placeholder not in text, placeholder


def test_every_lua_file_is_used() -> None:
    used = {"common", "match", "store", "remove", "clear", "shared_load"}
    used |= {f"lease_{n}" for n in ("acquire", "renew", "release", "commit", "position")}
    assert set(LUA) == used
    assert all(scripts.source(name).strip() for name in LUA)
