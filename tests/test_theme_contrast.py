"""monarch_nb's text in JupyterLab stays readable in the light and the dark theme
(WCAG AA: 4.5:1 against what is behind it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_harness import SKIP_WITHOUT_CHROMIUM, notebook_page, served_notebook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), SKIP_WITHOUT_CHROMIUM]

ARTIFACTS = Path(__file__).parent / "artifacts"
CELLS = [
    "%load_ext monarch_nb",
    "%mesh start --procs 2",
    "%%mesh\nimport time\ntime.sleep(0.6 if rank == 1 else 0)",  # a straggler's badge
    "%%mesh\n1 / (rank - 1)",  # rank 1 fails: a failure in the dashboard and the panel
    "%mesh timeline",  # its chart and legend
]

# WCAG 2 contrast of an element's text against the first opaque background
# behind it (its own, or an ancestor's); colours as the browser computed them.
CONTRAST = """el => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = c => {
    const [r, g, b] = c.slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  let bg = null;
  for (let node = el; node && !bg; node = node.parentElement) {
    const c = rgb(getComputedStyle(node).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] === 1)) bg = c;
  }
  const fg = rgb(getComputedStyle(el).color);
  const [a, b] = [lum(fg), lum(bg || [255, 255, 255])].sort((x, y) => y - x);
  return (a + 0.05) / (b + 0.05);
}"""

# The same for SVG text, whose colour is its fill.
FILL_CONTRAST = CONTRAST.replace("getComputedStyle(el).color", "getComputedStyle(el).fill")
LUMINANCE = """el => {
  const [r, g, b] = (getComputedStyle(el).backgroundColor.match(/[\\d.]+/g) || []).map(Number);
  const lin = v => (v /= 255) <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}"""
# Output areas wider than their content scroll sideways: none of ours may.
OVERFLOWING = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
  .filter(el => el.querySelector('.mnb-dashboard, .monarch-nb-timeline'))
  .filter(el => el.scrollWidth > el.clientWidth + 1)
  .map(el => el.scrollWidth + ' > ' + el.clientWidth)"""
# The chart's labels (tick labels, the metric's name) lie inside its drawing.
CLIPPED = """() => [...document.querySelectorAll('.mnb-chart svg')]
  .filter(svg => !svg.parentElement.closest('svg'))
  .flatMap(svg => {
    const box = svg.getBoundingClientRect();
    return [...svg.querySelectorAll('text')].filter(t => {
      const b = t.getBoundingClientRect();
      return b.width > 0 && (b.left < box.left - 1 || b.right > box.right + 1
        || b.top < box.top - 1 || b.bottom > box.bottom + 1);
    }).map(t => t.textContent);
  })"""

CHECKED_SVG = {
    "the chart's legend": ".mnb-chart .legendtext",
    "the timeline's legend": ".monarch-nb-timeline .legendtext",
}

CHECKED = {
    "the %%mesh badge": ".jp-Notebook .jp-MonarchNb-badge",
    "a failure in the dashboard": ".mnb-failure",
    "the straggler badge": ".mnb-straggler",
    "a rank's tile": ".mnb-tile",
    "a failure in the Mesh panel": "#monarch-nb-panel .jp-MonarchNb-failures li",
    "a failed rank in the Mesh panel": (
        "#monarch-nb-panel tr[data-state='failed'] .jp-MonarchNb-rankState"
    ),
    "the remote traceback": (
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    ),
}


@pytest.fixture(params=["JupyterLab Dark", "JupyterLab Light"])
def themed_lab(request, tmp_path: Path) -> Iterator[tuple[str, str]]:
    themes = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    themes.mkdir(parents=True)
    (themes / "themes.jupyterlab-settings").write_text(json.dumps({"theme": request.param}))
    with served_notebook(tmp_path, CELLS, name="themed.ipynb") as url:
        yield request.param, url


def test_text_keeps_its_contrast_in_either_theme(themed_lab: tuple[str, str]) -> None:
    theme, url = themed_lab
    wait = {"timeout": 30_000}
    ARTIFACTS.mkdir(exist_ok=True)
    with notebook_page(url, height=1200) as page:
        page.keyboard.press("Shift+Enter")  # %mesh start
        page.locator(".mnb-tile").nth(1).wait_for(**wait)
        page.keyboard.press("Shift+Enter")  # rank 1 straggles
        page.locator(".mnb-straggler").first.wait_for(**wait)
        # The badge's row: "slow 3.1x in cell [3]".
        straggler = page.locator(".mnb-straggler").first.evaluate("e => e.parentElement.innerText")
        prompt = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-InputPrompt")
        page.keyboard.press("Shift+Enter")  # the failing cell
        page.locator(".mnb-failure").first.wait_for(**wait)
        page.keyboard.press("Shift+Enter")  # %mesh timeline
        page.locator(".monarch-nb-timeline").wait_for(**wait)
        page.locator(".mnb-chart .legendtext").first.wait_for(**wait)
        page.click('.jp-SideBar [data-id="monarch-nb-panel"]')
        page.locator("#monarch-nb-panel .jp-MonarchNb-mesh").wait_for(**wait)
        page.locator("#monarch-nb-panel .jp-MonarchNb-failures li").first.wait_for(**wait)
        prompt_text = prompt.inner_text()
        light = "true" if theme == "JupyterLab Light" else "false"
        assert page.evaluate("document.body.dataset.jpThemeLight") == light
        ratios = {}
        for what, selector in CHECKED.items():
            found = page.locator(selector)
            found.first.wait_for(**wait)
            ratios[what] = min(found.nth(i).evaluate(CONTRAST) for i in range(found.count()))
        for what, selector in CHECKED_SVG.items():
            found = page.locator(selector)
            ratios[what] = min(found.nth(i).evaluate(FILL_CONTRAST) for i in range(found.count()))
        tiles = page.locator(".mnb-tile")
        brightest = max(tiles.nth(i).evaluate(LUMINANCE) for i in range(tiles.count()))
        overflowing = page.evaluate(OVERFLOWING)
        clipped = page.evaluate(CLIPPED)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"theme_{theme.split()[-1].lower()}.png"))
    # The mark names its cell by the number beside it on the page (issue 62 item 2).
    assert f" in cell {prompt_text.strip().removesuffix(':')}" in straggler, straggler
    low = {what: round(r, 2) for what, r in ratios.items() if r < 4.5}
    assert not low, f"below 4.5:1 in {theme}: {low} (all: {ratios})"
    if theme == "JupyterLab Dark":  # dark tiles on a dark page, not bright pastel
        assert brightest < 0.15, f"a tile's background has luminance {brightest:.2f}"
    assert not overflowing, f"outputs that scroll sideways: {overflowing}"
    assert not clipped, f"chart labels cut off at its edge: {clipped}"
