"""Real-time tests: the only tests that ``scripts/test.sh`` may run a second time.

A test marked ``@pytest.mark.realtime(race="...")`` asserts on wall-clock time against real processes (a
lease fails over within its TTL, a scrape goes stale within a bound), so a loaded 2-core machine can make it
lose a race that an idle one never loses. ``race`` names that race; the marker without it is a usage error.
Every other test must pass the first time: a failure there is a bug to find, never retried.

With ``--failures-file PATH`` the session writes the node ids of the tests that failed (in setup, call or
teardown) as JSON ``{"realtime": [...], "other": [...]}``. ``python -m tests.support.realtime PATH`` prints
the real-time ones, one per line, and exits 0, or names the others on stderr and exits 1 (nothing to retry).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

MARKER = "realtime"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--failures-file", default=None, help="write failed node ids (real-time or other) as JSON")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f'{MARKER}(race="..."): asserts on wall-clock time; the only kind scripts/test.sh retries once'
    )
    config.stash[_FAILED] = {"realtime": [], "other": []}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unnamed = [item.nodeid for item in items if (m := item.get_closest_marker(MARKER)) and not m.kwargs.get("race")]
    if unnamed:
        raise pytest.UsageError(f"@pytest.mark.{MARKER} needs race='the race it tolerates': {unnamed}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.failed:
        kind = "realtime" if item.get_closest_marker(MARKER) else "other"
        failed = item.config.stash[_FAILED][kind]
        if item.nodeid not in failed:
            failed.append(item.nodeid)
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--failures-file")
    if path:
        Path(path).write_text(json.dumps(session.config.stash[_FAILED]))


_FAILED = pytest.StashKey[dict[str, list[str]]]()


def main(argv: list[str]) -> int:
    failed = json.loads(Path(argv[1]).read_text())
    if failed["other"]:
        print("failed, and not retried (not marked real-time):", *failed["other"], sep="\n  ", file=sys.stderr)
        return 1
    print("\n".join(failed["realtime"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
