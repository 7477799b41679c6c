"""Open the report of a tiny real `compare` in headless Chromium (Debian's package) via Playwright.

Skipped with a reason when /usr/bin/chromium or Playwright is missing; `.ci/run` installs Chromium so
it runs in CI. The screenshot lands in results/report_screenshot.png (results/ is git-ignored).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import sim
from sim.api import run_label
from sim.reports.publish import report
from sim.reports.render import TABLE_COLUMNS
from sim.results import write_run
from sim.scenario.scenario import default_scenario

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = Path(__file__).resolve().parents[2] / "results" / "report_screenshot.png"


def _playwright():
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium not installed at {CHROMIUM} (apt-get install chromium; .ci/run does it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright)")
    return sync_playwright


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    sync_playwright = _playwright()
    scenario = default_scenario().with_overrides(num_prompts=80, **{"workload.request_rate": 6.0})
    # four runs, two with long labels: the widest summary table a compare of the paper's allocators makes
    allocators = ["contiguous", "request_limit:oracle:best_fit", "paged", "request_limit:pow2:buddy"]
    runs = sim.compare(scenario, allocators=allocators)
    written = [write_run(run, tmp_path / "compare" / run_label(label)) for label, run in runs.items()]
    html_path = report(written)

    console_errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.on("console", lambda msg: console_errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: console_errors.append(str(exc)))
            page.on("requestfailed", lambda request: console_errors.append(f"request failed: {request.url}"))
            page.goto(html_path.as_uri(), wait_until="load")
            images = page.evaluate(
                "Array.from(document.images).map(img => ({complete: img.complete, width: img.naturalWidth}))"
            )
            rows = page.locator("#summary tbody tr")
            row_labels = [rows.nth(i).locator("td.label").inner_text() for i in range(rows.count())]
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            temporary = SCREENSHOT.with_name(f".{SCREENSHOT.name}.tmp.png")
            page.screenshot(path=str(temporary), full_page=True)
            shutil.move(temporary, SCREENSHOT)
            layouts = {}
            for width in (1280, 900):  # a normal window: everything fits; a narrow one: the table scrolls
                page.set_viewport_size({"width": width, "height": 900})
                layouts[width] = page.evaluate(SUMMARY_LAYOUT_JS)
        finally:
            browser.close()

    assert len(images) == 4
    assert all(image["complete"] and image["width"] > 0 for image in images), images
    assert row_labels == list(runs)
    assert console_errors == []
    assert SCREENSHOT.stat().st_size > 10_000
    # issue 11: no column of the summary table is cut off at 1280 px (it fits); narrower, it scrolls
    columns = len(TABLE_COLUMNS) + 1
    normal, narrow = layouts[1280], layouts[900]
    assert normal["headers"] == columns and normal["cut"] == [] and not normal["page_overflows"], normal
    assert narrow["headers"] == columns and narrow["scrollable"] and narrow["cut_after_scrolling"] == [], (
        narrow
    )


# What a reader sees of the summary table: headers whose right edge lies beyond the visible part of
# the table's scroll box ("cut"), whether the box scrolls, and what is still cut after scrolling it
# all the way right (nothing, if the table scrolls rather than clips).
SUMMARY_LAYOUT_JS = """() => {
  const table = document.querySelector('#summary');
  const box = table.closest('.scroll');
  const headers = Array.from(table.querySelectorAll('thead th'));
  const cutNow = () => {
    const right = Math.min(box.getBoundingClientRect().right, window.innerWidth);
    return headers.filter(th => th.getBoundingClientRect().right > right + 0.5).map(th => th.innerText);
  };
  const cut = cutNow();
  const overflow = getComputedStyle(box).overflowX;
  const scrollable = ['auto', 'scroll'].includes(overflow) && box.scrollWidth > box.clientWidth;
  box.scrollLeft = box.scrollWidth;
  const last = headers[headers.length - 1].getBoundingClientRect();
  const cutAfter = last.right > Math.min(box.getBoundingClientRect().right, window.innerWidth) + 0.5
    ? [headers[headers.length - 1].innerText] : [];
  box.scrollLeft = 0;
  return {headers: headers.length, cut: cut, scrollable: scrollable, cut_after_scrolling: cutAfter,
          page_overflows: document.documentElement.scrollWidth > window.innerWidth};
}"""
