"""``cliffguard report``: the content (store read API only), the JSON, the terminal summary, and the
self-contained page rendered in the real headless Chromium (its screenshot is docs/report.png:
``CLIFFGUARD_UPDATE_DOCS_SHOT=1`` refreshes it)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from cliffguard.cli import main
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.report.data import report_data
from cliffguard.report.html import render
from testing.browser import Chromium, chromium_path
from testing.goodput_script import book_through_controller, schedule

REPO = Path(__file__).resolve().parents[2]
DOCS_SHOT = REPO / "docs" / "report.png"


@pytest.fixture
def store(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    init_db(engine)
    s = schedule()
    book_through_controller(engine, s.events())
    yield engine, url, s
    engine.dispose()


def _embedded(html: str) -> dict:
    blob = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert blob is not None
    return json.loads(blob.group(1).replace("<\\/", "</"))


def test_the_page_carries_the_same_content_as_the_json(store, tmp_path, capsys):
    engine, url, s = store
    with session_scope(engine) as ses:
        data = report_data(ses, s.run, now=0.0)
    assert data is not None
    html = render(data)
    assert "<script src" not in html and "http" not in html.split('id="report-data"')[0].replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # nothing to fetch: one self-contained file
    assert _embedded(html) == json.loads(json.dumps(data, default=str))
    assert html.count("<svg") >= 4  # the share bar, the stacked chart, the loss, the MFU
    g = data["goodput"]
    assert g["seconds"]["productive"] == pytest.approx(s.expected["productive"])
    assert {r["kind"] for r in data["restarts"]} == {"restart", "elastic"}
    assert data["incidents"] and all("cost" in i and "timeline" in i for i in data["incidents"])
    out, js = tmp_path / "r.html", tmp_path / "r.json"
    assert main(["report", s.run, "--db", url, "--html", str(out), "--json", str(js)]) == 0
    assert _embedded(out.read_text())["goodput"]["seconds"] == json.loads(js.read_text())["goodput"]["seconds"]
    assert main(["report", s.run, "--db", url]) == 0
    text = capsys.readouterr().out
    assert f"ETTR {100 * g['ettr']:.1f} %" in text and "steps rolled back" in text
    assert main(["report", "no-such-run", "--db", url]) == 1


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_the_report_renders_in_chromium(store, tmp_path):
    if chromium_path() is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is required in CI (scripts/test.sh installs it)")
        pytest.skip("chromium not installed")
    engine, url, s = store
    page = tmp_path / "report.html"
    assert main(["report", s.run, "--db", url, "--html", str(page)]) == 0
    browser = Chromium(tmp_path / "profile", width=1000, height=2300)
    try:
        browser.goto(page.as_uri())
        ettr = browser.wait_for("document.getElementById('ettr') && document.getElementById('ettr').textContent")
        want = _embedded(page.read_text())["goodput"]["ettr"]
        assert ettr == f"{100 * want:.1f} %"
        drawn = browser.evaluate("Array.from(document.querySelectorAll('svg.plot')).filter(s => "
                                 "s.getBoundingClientRect().width > 500 && s.querySelector('path,polygon,rect'))"
                                 ".length")
        assert drawn >= 4
        areas = browser.evaluate("document.querySelectorAll('svg.plot polygon').length")
        assert areas >= 5  # one band per bucket that holds time, stacked
        shot = browser.screenshot(tmp_path / "report.png")
    finally:
        browser.close()
    assert shot.stat().st_size > 40_000  # a drawn page, not a blank one
    if os.environ.get("CLIFFGUARD_UPDATE_DOCS_SHOT") == "1":
        shutil.copyfile(shot, DOCS_SHOT)


def test_what_each_remedy_cost_across_runs(store, capsys):
    engine, url, s = store
    assert main(["report", "--remedies", "--days", "100000", "--db", url, "--json", "-"]) == 0
    rows = {r["remedy"]: r for r in json.loads(capsys.readouterr().out)["remedies"]}
    assert rows["restart"]["count"] == 1 and rows["elastic"]["count"] == 2
    assert main(["report", "--remedies", "--db", url]) == 0
    assert "restart" in capsys.readouterr().out
    assert main(["report", "--db", url]) == 2
