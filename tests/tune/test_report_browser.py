"""`spectune report`'s pages as a person sees them, in headless Chromium (tests/helpers/browser.py).

The pages are made from the committed example (docs/examples/smollm2-cpu): the sweep, its validation, and a gate of
the grid sweep against the guided one. Each is opened at 1280x800 (a laptop's first screen) and at 390 px wide (a
phone, mobile emulation) and checked for: no console error, every image loaded (natural width > 0), the answer
(``#answer``) and, on the sweep page, the speedup heatmap (``#heatmap``) inside the first screen at 1280x800, and
nothing wider than the phone's viewport. Skips, saying why, where Debian's ``chromium`` is not installed.
"""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from spectune.cli import app
from helpers.browser import Chromium, find_chromium
from helpers.paths import EXAMPLES

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (Debian's package: "
                                "apt-get install chromium; .ci/run installs it)")

EXAMPLE = EXAMPLES / "smollm2-cpu"
FIRST_SCREEN = (1280, 800)
PHONE = (390, 844)

MEASURE = """((width) => {
  const rect = s => { const e = document.querySelector(s); if (!e) return null;
                      const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, height: r.height}; };
  const scrolls = e => { for (let p = e.parentElement; p; p = p.parentElement) {
                           if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX)) return true; }
                         return false; };
  return {
    images: document.images.length,
    broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt || i.src.slice(0, 60)),
    answer: rect('#answer'), heatmap: rect('#heatmap'),
    viewport: innerWidth, scrollWidth: document.documentElement.scrollWidth,
    tooWide: [...document.querySelectorAll('body *')]
      .filter(e => e.getBoundingClientRect().right > width + 0.5 && !scrolls(e))
      .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')).slice(0, 8),
  };
})"""
"""JavaScript: what a person sees, for a screen ``width`` px wide: the images and those that did not load, where the
answer and the heatmap sit, the layout's width, and the first elements that stick out past ``width`` (outside a box
that scrolls)."""


def make_pages(out) -> dict[str, object]:
    """report.html of the example's sweep, of its validation and of a gate (grid sweep vs guided sweep)."""
    runner = CliRunner()
    args = {"sweep": [str(EXAMPLE / "sweep")], "validation": [str(EXAMPLE / "validate")],
            "gate": [str(EXAMPLE / "sweep"), "--baseline", str(EXAMPLE / "sweep-guided")]}
    pages = {}
    for name, a in args.items():
        res = runner.invoke(app, ["report", *a, "-o", str(out / name)])
        assert res.exit_code == 0, res.output
        pages[name] = out / name / "report.html"
    return pages


async def measure_all(pages: dict[str, object]) -> dict[tuple[str, str], dict]:
    """{(page, "laptop"|"phone"): MEASURE's result plus the console errors}, one browser for all."""
    out = {}
    async with Chromium() as tab:
        for name, path in pages.items():
            for view, (w, h) in (("laptop", FIRST_SCREEN), ("phone", PHONE)):
                await tab.open(path.resolve().as_uri(), w, h, mobile=view == "phone")
                out[(name, view)] = {**await tab.eval(f"{MEASURE}({w})"), "errors": list(tab.errors)}
    return out


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """The three pages as the browser shows them at both widths (:func:`measure_all`)."""
    return asyncio.run(measure_all(make_pages(tmp_path_factory.mktemp("pages"))))


CASES = [(p, v) for p in ("sweep", "validation", "gate") for v in ("laptop", "phone")]


@pytest.mark.parametrize("page,view", CASES)
def test_no_console_errors(seen, page, view):
    assert seen[(page, view)]["errors"] == []


@pytest.mark.parametrize("page,view", CASES)
def test_every_image_loaded(seen, page, view):
    assert seen[(page, view)]["broken"] == []


def test_sweep_page_has_its_six_plots(seen):
    assert seen[("sweep", "laptop")]["images"] == 6


@pytest.mark.parametrize("page", ["sweep", "validation", "gate"])
def test_answer_inside_first_screen(seen, page):
    answer = seen[(page, "laptop")]["answer"]
    assert answer is not None, "no #answer element"
    assert 0 <= answer["top"] and answer["bottom"] <= FIRST_SCREEN[1], f"#answer at {answer} in a 1280x800 screen"


def test_heatmap_inside_first_screen(seen):
    heat = seen[("sweep", "laptop")]["heatmap"]
    assert heat is not None, "no #heatmap element"
    assert 0 <= heat["top"] and heat["bottom"] <= FIRST_SCREEN[1], f"#heatmap at {heat} in a 1280x800 screen"


@pytest.mark.parametrize("page", ["sweep", "validation", "gate"])
def test_nothing_wider_than_a_phone(seen, page):
    m = seen[(page, "phone")]
    # a phone widens its layout viewport to fit content that sticks out, so both widths are held to the screen's
    wide = max(m["viewport"], m["scrollWidth"])
    assert wide <= PHONE[0], f"page {wide} px wide on a {PHONE[0]} px screen; sticking out: {m['tooWide']}"
