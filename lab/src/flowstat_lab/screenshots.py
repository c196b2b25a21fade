"""The report in a real browser: headless Chromium (Debian's chromium and chromedriver, driven by
Selenium) at a laptop's screen, the checks the tests make on it (nothing wider than the page, every
plot drawn, the verdicts on the first screen, hover shows values), and the screenshots in docs/img/,
made by this same code, never by hand.

    python -m flowstat_lab.screenshots [--out docs/img] [--runs-dir DIR]

records the demo's two runs (benchmark-harness/topologies/demo.yaml and demo-overload.yaml, as
``make demo`` does, without the stores), makes a run of 500 producers from the first (its producer's
samples copied to 500 nodes: no machine here runs 500 producer processes), writes their reports and
saves docs/img/report-first-screen.webp (the demo's two runs, as a person opens the report),
report-detail.webp (a run's merger plots) and report-500-producers.webp (the heat maps of 500 nodes).
A repository generator (``make generate``, when there is one) calls ``generate()``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flowstat_lab import ROOT

CHROMEDRIVER = "/usr/bin/chromedriver"
LAPTOP = (1366, 768)  # the screen the report is checked and pictured at (CSS pixels)

# Bokeh's plot views, and how many have drawn (laid out, with a canvas of their size).
PLOT_VIEWS = """
const plots = [...Bokeh.index.all_views()].filter(v => v.model instanceof Bokeh.Models.get('Plot'));
return {plots: plots.length, drawn: plots.filter(v => v.has_finished() && v.canvas_view.bbox.width > 0).length};
"""

# What sticks out sideways: the page scrolls sideways (document scrollWidth > clientWidth), an
# element reaches past the page's right edge or is wider than it, or a box scrolls sideways inside.
OVERFLOW = """
const doc = document.documentElement, width = doc.clientWidth, out = [];
if (doc.scrollWidth > width) out.push('the page scrolls sideways: scrollWidth ' + doc.scrollWidth + ' > ' + width);
const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
    + (e.className && e.className.baseVal === undefined
       ? '.' + String(e.className).trim().split(/\\s+/).join('.') : '');
for (const e of document.body.querySelectorAll('*')) {
  const r = e.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;
  if (r.right > width + 0.5 || r.width > width + 0.5 || r.left < -0.5)
    out.push(name(e) + ': ' + Math.round(r.left) + '..' + Math.round(r.right) + ' px of ' + width);
  const style = getComputedStyle(e);
  if (['auto', 'scroll'].includes(style.overflowX) && e.scrollWidth > e.clientWidth + 1)
    out.push(name(e) + ' scrolls sideways: ' + e.scrollWidth + ' > ' + e.clientWidth);
}
return out.slice(0, 20);
"""

# The verdict badges on the first screen: each wholly inside the window without scrolling.
ABOVE_FOLD = """
window.scrollTo(0, 0);
return [...document.querySelectorAll('[data-verdict]')].map(e => {
  const r = e.getBoundingClientRect();
  return {run: e.closest('section.card').querySelector('.run-name').textContent, verdict: e.textContent,
          top: r.top, bottom: r.bottom, visible: r.top >= 0 && r.bottom <= window.innerHeight && r.width > 0};
});
"""


@contextmanager
def browser(size: tuple[int, int] = LAPTOP) -> Iterator:
    """Headless Chromium whose page is ``size`` CSS pixels (the window's inside, as a laptop's screen
    shows a page), with its console and network logged."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not Path(CHROMEDRIVER).exists():
        raise RuntimeError("chromedriver missing: apt-get install chromium chromium-driver (make test does)")
    profile = tempfile.mkdtemp(prefix="flowstat-chromium-")
    opts = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={size[0]},{size[1]}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False},
        )
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_report(driver, path: Path, plots: int, deadline_s: float = 60) -> dict:
    """Load a report and wait until Bokeh has drawn as many plots as the report says it made (or the
    deadline). What the page drew, when (``drawn_ms``: from navigation start to every plot drawn,
    polled every 20 ms), what it logged and requested."""
    driver.get_log("browser"), driver.get_log("performance")  # what an earlier page left
    driver.get(path.resolve().as_uri())
    end = time.monotonic() + deadline_s
    while True:
        views = driver.execute_script(
            "return window.Bokeh && Bokeh.documents.length && Bokeh.documents.every(d => d.is_idle) ? (() => {"
            + PLOT_VIEWS.replace("return {", "return {now: performance.now(), ")
            + "})() : null"
        )
        if (views and views["drawn"] >= plots) or time.monotonic() > end:
            break
        time.sleep(0.02)
    if not views:
        raise AssertionError(f"{path}: Bokeh did not draw its documents in {deadline_s} s")
    log = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    requests = [m["params"]["request"]["url"] for m in log if m["method"] == "Network.requestWillBeSent"]
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    return {
        "plots": views["plots"],
        "drawn": views["drawn"],
        "drawn_ms": round(views["now"]),
        "requests": requests,
        "severe": severe,
    }


def overflow(driver) -> list[str]:
    """What is wider than the page (at the window's width): [] when nothing is."""
    return driver.execute_script(OVERFLOW)


def verdicts_above_fold(driver) -> list[dict]:
    return driver.execute_script(ABOVE_FOLD)


def hover(driver, plot_index: int, x_fraction: float = 0.5, y_fraction: float = 0.5) -> str:
    """Move the mouse over plot ``plot_index`` of the page (its frame, at the fractions of its width and
    height) and return the text of the tooltip Bokeh shows there ('' if none)."""
    box = driver.execute_script(
        """
        const v = [...Bokeh.index.all_views()].filter(v => v.model instanceof Bokeh.Models.get('Plot'))[arguments[0]];
        v.el.scrollIntoView({block: 'center'});
        const r = v.el.getBoundingClientRect(), f = v.frame.bbox;
        return {left: r.left + f.left, top: r.top + f.top, width: f.width, height: f.height};""",
        plot_index,
    )
    x, y = box["left"] + box["width"] * x_fraction, box["top"] + box["height"] * y_fraction
    driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    time.sleep(0.3)
    return driver.execute_script("""
        const texts = [];
        const walk = (root) => {
          for (const e of root.querySelectorAll('*')) {
            if (e.shadowRoot) walk(e.shadowRoot);
            if (e.classList && [...e.classList].some(c => /tooltip/i.test(c)) && e.offsetParent !== null)
              texts.push(e.innerText || e.textContent);
          }
        };
        walk(document);
        return texts.filter(t => t && t.trim()).join(' | ');""")


def screenshot(driver, path: Path, scroll_to: str | None = None) -> Path:
    """The window as it shows now (scrolled to the element ``scroll_to``, else the top)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if scroll_to:
        driver.execute_script("document.getElementById(arguments[0]).scrollIntoView()", scroll_to)
    else:
        driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.2)
    save_picture(driver.get_screenshot_as_png(), path)
    return path


PALETTE = 32  # colours: a page of flat colours and a colour scale or two looks the same with 32 as with all
# (the four pictures of docs/img re-quantized from 64 to 32: 120 -> 110 kB, the heat maps alike to the eye;
# an octree's palette instead of median cut's: 102 kB, and the graph's hues kept, which 16 or 24 lose)


def save_picture(png: bytes, path: Path) -> None:
    """The screenshot in a palette of PALETTE colours, as lossless WebP: half the bytes of a 256-colour
    PNG in git (230 -> 118 kB for the four of docs/img), and every browser shows it."""
    import io

    from PIL import Image

    paletted = Image.open(io.BytesIO(png)).convert("RGB").quantize(PALETTE, method=Image.Quantize.FASTOCTREE)
    paletted.save(path, "WEBP", lossless=True, method=6)


# -- the runs pictured ---------------------------------------------------------------------------------


def record_demo(runs_dir: Path) -> list[Path]:
    """The demo's two runs, as ``make demo`` records them (without its stores)."""
    from flowstat.harness.orchestrator import run_topology
    from flowstat.harness.topology import load

    out = []
    for name in ("demo", "demo-overload"):
        topo = load(ROOT / "benchmark-harness" / "topologies" / f"{name}.yaml")
        out.append(Path(run_topology(topo, runs_dir=runs_dir)["run_dir"]))
    return out


def many_producers(source: Path, out: Path, producers: int = 500) -> Path:
    """A run of ``producers`` producer nodes made from a real one: its producer node's samples copied
    to PRODUCER~K (each a little apart in value, as real ones would be), its other nodes as they were;
    the run document says so (parameters.producers, producer_processes)."""
    lines = (source / "samples.ndjson").read_text().splitlines()
    header, body = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    run_id = out.name
    header["flowstat_run"] = {
        **header["flowstat_run"],
        "run_id": run_id,
        "parameters": {
            **header["flowstat_run"].get("parameters", {}),
            "producers": producers,
            "producer_processes": producers,
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "samples.ndjson", "w") as f:
        f.write(json.dumps(header) + "\n")
        for doc in body:
            if "flowstat_agent" in doc:
                doc["flowstat_agent"]["run_id"] = run_id
            else:
                doc["run_id"] = run_id
            if doc.get("role") != "producer":
                f.write(json.dumps(doc) + "\n")
                continue
            for k in range(producers):
                copy = {**doc, "node_id": f"{doc['node_id']}~{k}"}
                for name in ("cpu_clock_hz", "vmrss_kb"):
                    if name in copy:  # the copies a little apart, as 500 real producers would be
                        value = copy[name] * (1 + 0.3 * ((k * 7919 + copy.get("seq", 0) * 31) % 100) / 100)
                        copy[name] = int(value) if isinstance(doc[name], int) else value
                f.write(json.dumps(copy) + "\n")
    doc = json.loads((source / "run.json").read_text())
    doc["run_id"] = out.name
    doc["parameters"].update(producers=producers, producer_processes=producers)
    doc["label"] = doc.get("label", "").replace(source.name, out.name)
    (out / "run.json").write_text(json.dumps(doc, indent=1))
    return out


def generate(out: Path = ROOT / "docs" / "img", runs_dir: Path | None = None) -> list[Path]:
    """The report's screenshots in ``out``, from runs recorded now (in ``runs_dir``, else a temporary
    folder)."""
    from flowstat.report.build import write_report

    with tempfile.TemporaryDirectory(prefix="flowstat-screenshots-") as tmp:
        runs = Path(runs_dir or tmp)
        demo = record_demo(runs)
        many = many_producers(demo[0], runs / "demo-500-producers")
        shots = []
        with browser() as driver:
            both = write_report(demo, Path(tmp) / "demo.html")
            open_report(driver, both.path, both.plots)
            shots.append(screenshot(driver, out / "report-first-screen.webp"))
            shots.append(screenshot(driver, out / "report-detail.webp", scroll_to="run-1-merger"))
            big = write_report([many], Path(tmp) / "many.html")
            open_report(driver, big.path, big.plots)
            shots.append(screenshot(driver, out / "report-500-producers.webp", scroll_to="run-0-producer"))
        return shots


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m flowstat_lab.screenshots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the pictures go (docs/img)")
    ap.add_argument("--runs-dir", type=Path, help="keep the recorded runs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    for path in generate(args.out, args.runs_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
