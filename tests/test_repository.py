"""What the repository tracks: source and text, plus the few binary files it means to ship.

A build output (a wheel, a compiled module, a built site, a database) committed by accident is
caught here, in every run, instead of by a reader of ``git ls-files`` before a stop.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the binary files the repository ships on purpose -> why
SHIPPED_BINARIES = {
    "docs/dashboard.png": "the dashboard screenshot on the front page (refreshed by tests/dashboard/test_browser.py)",
    "docs/report.png": "a `cliffguard report` page in Chromium, on docs/goodput.md (refreshed by tests/cliffguard/test_report.py)",
    "tests/dashboard/data/demo_store.db": "a real demo run's store (scripts/record_demo_store.sh)",
    "tests/dashboard/data/elastic_store.db": "a real elastic run's store (scripts/record_demo_store.sh)",
}
BUILD_OUTPUT = (".whl", ".egg", ".so", ".pyc", ".pyd", ".o", ".a", ".tar.gz", ".zip")
BUILD_DIRS = ("build", "dist", "site", ".venv", "__pycache__")
MAX_BYTES = 4 * 1024 * 1024


def tracked() -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [p for p in out.stdout.decode().split("\0") if p]


def is_binary(path: Path) -> bool:
    head = path.read_bytes()[:8192]
    if b"\0" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 4  # (a multi-byte character cut at the end of the head is text)
    return False


def test_only_the_declared_binaries_are_tracked():
    found = {p for p in tracked() if (ROOT / p).is_file() and is_binary(ROOT / p)}
    assert found == set(SHIPPED_BINARIES), "binary files tracked beside the declared ones: " \
        f"{sorted(found - set(SHIPPED_BINARIES))}; declared but gone: {sorted(set(SHIPPED_BINARIES) - found)}"


def test_no_build_output_or_oversized_file_is_tracked():
    files = tracked()
    outputs = [p for p in files if p.endswith(BUILD_OUTPUT) or set(Path(p).parts[:-1]) & set(BUILD_DIRS)]
    big = [p for p in files if (ROOT / p).is_file() and (ROOT / p).stat().st_size > MAX_BYTES]
    assert outputs == [] and big == []


def test_the_binary_check_tells_text_from_binary(tmp_path):
    (tmp_path / "a.py").write_text("print('héllo')\n")
    (tmp_path / "b.whl").write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x08\x00")
    assert not is_binary(tmp_path / "a.py") and is_binary(tmp_path / "b.whl")
