"""The container images run as a non-root user (static check: no Docker engine is needed).

Every Dockerfile in the repository must end its final stage with a ``USER`` that is neither root nor uid 0,
and no compose file or Kubernetes manifest may switch a container back to root.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bench.stack_config import REPO

_SKIP = {".git", ".venv", "node_modules", "tokenizer_cache", "__pycache__"}


def _files(patterns: tuple[str, ...]) -> list[Path]:
    found = []
    for pattern in patterns:
        for path in REPO.rglob(pattern):
            if path.is_file() and not _SKIP & set(path.relative_to(REPO).parts):
                found.append(path)
    return sorted(set(found))


DOCKERFILES = _files(("Dockerfile", "Dockerfile.*", "*.Dockerfile", "*.dockerfile"))


def final_stage_user(text: str) -> str | None:
    """The last ``USER`` of the last ``FROM`` stage (line continuations joined, comments dropped)."""
    lines = re.sub(r"\\\n", " ", text).splitlines()
    user = None
    for line in (raw.strip() for raw in lines):
        word = line.split(None, 1)[0].upper() if line and not line.startswith("#") else ""
        if word == "FROM":
            user = None
        elif word == "USER":
            user = line.split(None, 1)[1].strip()
    return user


def is_root(user: str) -> bool:
    name = user.split(":", 1)[0].strip().strip("\"'")
    return name in {"root", "0", ""}


@pytest.mark.parametrize("table", [("FROM a\nUSER 10001:10001\n", False), ("FROM a\nUSER app\nFROM b\n", True),
                                   ("FROM a\nUSER root\n", True), ("FROM a\nUSER 0:0\n", True)],
                         ids=["uid", "reset-by-new-stage", "root", "uid0"])  # fmt: skip
def test_the_check_itself(table: tuple[str, bool]) -> None:
    text, root = table
    user = final_stage_user(text)
    assert (user is None or is_root(user)) == root


@pytest.mark.parametrize("path", DOCKERFILES, ids=[str(p.relative_to(REPO)) for p in DOCKERFILES])
def test_image_runs_as_non_root(path: Path) -> None:
    user = final_stage_user(path.read_text())
    assert user is not None, f"{path.name}: the final stage sets no USER (it would run as root)"
    assert not is_root(user), f"{path.name}: final USER is {user!r}"


def test_there_is_an_image_to_check() -> None:
    assert DOCKERFILES, "no Dockerfile in the repository: the non-root guarantee is not shown"


def _docs(path: Path) -> list[object]:
    """Every YAML document in ``path``; a manifest that does not parse fails the test (it cannot be checked)."""
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        pytest.fail(f"{path}: not YAML, so it cannot be checked for root: {exc}")


def _walk(node: object) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((str(key), value))
            out += _walk(value)
    elif isinstance(node, list):
        for item in node:
            out += _walk(item)
    return out


def test_no_manifest_switches_a_container_back_to_root() -> None:
    manifests = _files(("docker-compose*.yml", "docker-compose*.yaml", "compose*.yml", "compose*.yaml"))
    manifests += [p for p in _files(("*.yaml", "*.yml")) if "deploy" in p.relative_to(REPO).parts]
    offending = []
    for path in sorted(set(manifests)):
        for doc in _docs(path):
            for key, value in _walk(doc):
                if key == "user" and isinstance(value, str | int) and is_root(str(value)):
                    offending.append(f"{path}: user: {value}")
                if key in ("runAsUser", "runAsGroup") and value == 0:
                    offending.append(f"{path}: {key}: 0")
                if key == "runAsNonRoot" and value is False:
                    offending.append(f"{path}: runAsNonRoot: false")
                if key == "privileged" and value is True:
                    offending.append(f"{path}: privileged: true")
    assert not offending, offending
