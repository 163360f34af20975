"""The real thing: ``cliffguard dashboard`` over stores recorded from real demo runs
(tests/dashboard/data/demo_store.db; elastic_store.db from ``cliffguard demo --elastic``), opened
in headless Chromium.

``CLIFFGUARD_UPDATE_DOCS_SHOT=1`` also copies the screenshot to docs/dashboard.png (the README's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from cliffguard.controller.broker import free_port
from cliffguard.controller.store.db import init_db, make_engine
from testing.browser import Chromium, chromium_path

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]
DOCS_SHOT = REPO / "docs" / "dashboard.png"


def _rendered(axis: str, mark: str) -> str:
    """JS: a drawn Vega chart with an axis titled ``axis`` and at least one data mark whose
    accessible label mentions ``mark`` (Vega labels axes and marks for screen readers)."""
    return f"""(() => {{
      for (const svg of document.querySelectorAll('[data-testid="stVegaLiteChart"] svg')) {{
        const r = svg.getBoundingClientRect();
        if (r.width < 200 || r.height < 60) continue;
        const hasAxis = Array.from(svg.querySelectorAll('g[aria-label]'))
          .some(g => g.getAttribute('aria-label').includes("titled '{axis}'"));
        const marks = Array.from(svg.querySelectorAll('path[aria-label]'))
          .filter(p => p.getAttribute('aria-label').includes('{mark}')).length;
        if (hasAxis && marks > 0) return marks;
      }}
      return 0;
    }})()"""


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"cliffguard dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("the dashboard did not become healthy")


def _need_chromium() -> None:
    if chromium_path() is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is required in CI (scripts/test.sh installs it)")
        pytest.skip("chromium not installed")


@contextmanager
def _served(tmp_path: Path, recording: str):
    """``cliffguard dashboard`` over a copy of ``data/<recording>.db`` upgraded to the newest schema
    (as a controller of this version would on start); yields (url, run id, browser)."""
    data = Path(__file__).parent / "data"
    shutil.copy(data / f"{recording}.db", tmp_path / "store.db")
    run_id = json.loads((data / f"{recording}.json").read_text())["run"]
    db = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(db)
    init_db(engine)
    engine.dispose()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("CLIFFGUARD_OPERATOR_TOKEN", "CLIFFGUARD_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))  # this checkout's code
    proc = subprocess.Popen(
        [sys.executable, "-m", "cliffguard.cli", "dashboard", "--db", db, "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, start_new_session=True,
    )
    browser = None
    try:
        _wait_healthy(url, proc)
        browser = Chromium(tmp_path / "chromium-profile", width=1400, height=2400)
        browser.goto(f"{url}/?run={run_id}")
        yield url, run_id, browser
    finally:
        if browser is not None:
            browser.close()
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_dashboard_renders_in_chromium(tmp_path):
    _need_chromium()
    with _served(tmp_path, "demo_store") as (_url, run_id, browser):
        assert browser.wait_for(_rendered("loss", "loss:"), timeout=150), "loss chart not rendered"
        # one bar per recovery state of each incident
        assert browser.wait_for(_rendered("seconds since the incident opened", "state:"), timeout=60) >= 2, \
            "incident timeline not rendered"
        browser.wait_for("document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] svg').length >= 12", timeout=60)
        time.sleep(1.5)  # let the last charts finish their first paint
        dom = browser.dom()
        assert "stException" not in dom, "a Streamlit exception is shown on the page"
        assert "Run <code" in dom or run_id in dom
        assert "Incidents" in dom and "Loss" in dom
        assert "Elastic scale changes" not in dom  # a run that never changed size
        shot = browser.screenshot(tmp_path / "dashboard.png")
        assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
        if os.environ.get("CLIFFGUARD_UPDATE_DOCS_SHOT") == "1":
            DOCS_SHOT.parent.mkdir(exist_ok=True)
            shutil.copyfile(shot, DOCS_SHOT)


def test_elastic_section_renders_in_chromium(tmp_path):
    """The store ``cliffguard demo --elastic`` wrote (data/elastic_store.db: world 4 -> 2 -> 4, a
    resumed and a rolled-back incident): the world-size chart is drawn with its stepped lines."""
    _need_chromium()
    with _served(tmp_path, "elastic_store") as (_url, _run_id, browser):
        assert browser.wait_for(_rendered("world size", "world:"), timeout=150), "elastic chart not rendered"
        time.sleep(1.0)
        dom = browser.dom()
        assert "stException" not in dom, "a Streamlit exception is shown on the page"
        assert "Elastic scale changes" in dom and "2 scale changes" in dom and "now world 4, global batch 16" in dom
