"""tests/support/realtime.py: which failures scripts/test.sh may retry (only @pytest.mark.realtime ones)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.stack_config import REPO

_TESTS = """
import pytest

def test_ok():
    pass

@pytest.mark.realtime(race="a stand-in for a failover deadline")
def test_slow_failover():
    assert False

def test_plain_bug():
    assert False
"""


def _run(tmp_path: Path, body: str, *args: str) -> tuple[int, dict[str, list[str]], str]:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.support.realtime"]\n')
    (tmp_path / "test_sample.py").write_text(body)
    out = tmp_path / "failures.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "--failures-file", str(out), str(tmp_path), *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    failed = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, failed, done.stdout + done.stderr


def _triage(path: Path) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", "tests.support.realtime", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def test_failures_are_split_into_realtime_and_other(tmp_path: Path) -> None:
    code, failed, out = _run(tmp_path, _TESTS)
    assert code == 1, out
    assert [i.split("::")[1] for i in failed["realtime"]] == ["test_slow_failover"]
    assert [i.split("::")[1] for i in failed["other"]] == ["test_plain_bug"]
    status, stdout, stderr = _triage(tmp_path / "failures.json")
    assert status == 1 and stdout == "" and "test_plain_bug" in stderr


def test_only_realtime_failures_are_offered_for_a_retry(tmp_path: Path) -> None:
    code, failed, out = _run(tmp_path, _TESTS, "-k", "not plain")
    assert code == 1 and failed["other"] == [], out
    status, stdout, _ = _triage(tmp_path / "failures.json")
    assert status == 0 and stdout.strip().endswith("test_sample.py::test_slow_failover")


def test_a_realtime_marker_must_name_its_race(tmp_path: Path) -> None:
    code, _, out = _run(tmp_path, "import pytest\n\n@pytest.mark.realtime\ndef test_x():\n    pass\n")
    assert code != 0 and "needs race=" in out, out


def test_scripts_test_sh_can_pass_the_option_without_naming_tests(tmp_path: Path) -> None:
    """As scripts/test.sh calls it: no test paths, so the option's value must not be taken for one (which
    moves the rootdir away and drops tests/conftest.py, the option's home)."""
    out = tmp_path / "failures.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider", f"--failures-file={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(out.read_text()) == {"realtime": [], "other": []}
