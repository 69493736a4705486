"""Check the built site's layout at one screen size in headless Chromium.

    mkdocs build --strict --site-dir /tmp/site && python docs/check_layout.py /tmp/site
    python docs/check_layout.py /tmp/site --screenshot /tmp/home.png   # and look at the home page

Builds nothing: it reads a site that `mkdocs build` wrote. It opens the home page, the quickstart, the
benchmarks summary and every study page, the technique cards, the fine-tuning page and the command-line
page at 1280 x 800 (`--width`, `--height`), after the theme's scripts have run, and reports

- every table that scrolls sideways: whose scroll box (the theme's wrapper, or the table itself) has a
  `scrollWidth` larger than its `clientWidth`, with the heading above it and its first header cells;
- every figure shown below 75% of its own width (its legend and tick labels then shrink below legibility);
- every code block under a "Quick start" heading that scrolls sideways (a quick start is read whole);
- whether the home page's first screen (the top `--height` pixels) holds the result sentence, the
  `Trainer` -> `FastTrainer` diff and the install line, each in full;
- as information only, the code blocks that scroll sideways (Python and YAML keep their lines).

Exit status 0 when no table scrolls and the first screen holds all three, 1 otherwise, 2 when Chromium is
missing. Needs a Chromium or Chrome binary (`apt-get install chromium`, or `--chromium PATH`) and nothing
else: the measurements run as a script injected into copies of the pages, and Chromium's `--dump-dom`
hands the result back.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PAGES = ("index.html", "getting-started/index.html", "benchmarks/index.html", "fine-tuning/index.html",
         "cli/index.html")
SECTIONS = ("benchmarks", "techniques")  # and every page under these folders
MIN_FIGURE_SCALE = 0.75  # a figure shown below this share of its own width is too small to read
# What the home page's first screen must show in full: (name, text it contains, CSS selector of the element)
FIRST_SCREEN = (
    ("result sentence", "reaches hf-best's final loss in", "article p"),
    ("Trainer -> FastTrainer diff", "from hf_fasttrain import FastTrainer", "article pre"),
    ("install line", "pip install .", "article pre"),
)
REPORT_ID = "check-layout-report"

# Runs after the theme's scripts (which wrap each table in a scroll box) and writes its findings as JSON
# into a <pre> that --dump-dom prints.
MEASURE = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  function scroller(el) {
    for (var e = el; e && e !== document.body; e = e.parentElement) {
      var o = getComputedStyle(e).overflowX;
      if (o === "auto" || o === "scroll") return e;
    }
    return el;
  }
  function heading(el) {
    var all = Array.prototype.slice.call(document.querySelectorAll("article h1, article h2, article h3, article h4"));
    var above = all.filter(function (h) {
      return h.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING; });
    return above.length ? above[above.length - 1].textContent.replace(/\\s+/g, " ").replace(/¶$/, "").trim() : "";
  }
  var out = {width: window.innerWidth, height: window.innerHeight, tables: [], code: [], first_screen: []};
  document.querySelectorAll("article table").forEach(function (t) {
    var boxes = [t, scroller(t.parentElement || t)];
    var worst = boxes.reduce(function (a, b) {
      return (b.scrollWidth - b.clientWidth) > (a.scrollWidth - a.clientWidth) ? b : a; });
    var cells = Array.prototype.slice.call(t.querySelectorAll("th")).slice(0, 3)
      .map(function (c) { return c.textContent.trim(); });
    out.tables.push({heading: heading(t), header: cells.join(" | "),
                     scroll_width: worst.scrollWidth, client_width: worst.clientWidth});
  });
  out.images = [];
  document.querySelectorAll("article img").forEach(function (img) {
    out.images.push({src: img.getAttribute("src").split("/").pop(), heading: heading(img),
                     natural_width: img.naturalWidth, shown_width: Math.round(img.getBoundingClientRect().width)});
  });
  document.querySelectorAll("article pre > code").forEach(function (c) {
    if (c.scrollWidth > c.clientWidth + 1)
      out.code.push({heading: heading(c), first_line: c.textContent.split("\\n")[0].slice(0, 60),
                     scroll_width: c.scrollWidth, client_width: c.clientWidth});
  });
  FIRST_SCREEN.forEach(function (want) {
    var found = Array.prototype.slice.call(document.querySelectorAll(want[2]))
      .filter(function (e) { return e.textContent.indexOf(want[1]) >= 0; })[0];
    var r = found ? found.getBoundingClientRect() : null;
    out.first_screen.push({name: want[0], found: !!found, top: r ? r.top : null, bottom: r ? r.bottom : null,
                           inside: !!r && r.top >= 0 && r.bottom <= window.innerHeight});
  });
  var pre = document.createElement("pre");
  pre.id = "REPORT_ID";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 500); });
</script>"""


def find_chromium(given: str | None) -> str | None:
    if given:
        return given
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_args(binary: str, width: int, height: int) -> list[str]:
    return [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", "--disable-extensions", f"--window-size={width},{height}"]


def measure(binary: str, page: Path, width: int, height: int) -> dict:
    """The page's measurements at a viewport of width x height (Chromium's window may be taller than its
    viewport: the window is grown by the difference once)."""
    report = _measure(binary, page, width, height)
    if (report["width"], report["height"]) != (width, height):
        report = _measure(binary, page, 2 * width - report["width"], 2 * height - report["height"])
    return report


def _measure(binary: str, page: Path, width: int, height: int) -> dict:
    """The page's measurements, from a copy of it with MEASURE injected before </body>."""
    script = (MEASURE.replace("FIRST_SCREEN", json.dumps(FIRST_SCREEN)).replace("REPORT_ID", REPORT_ID))
    text = page.read_text(encoding="utf-8")
    probe = page.with_name(page.stem + ".layout-probe.html")  # beside the page: its relative links still work
    probe.write_text(text.replace("</body>", script + "</body>", 1), encoding="utf-8")
    out = subprocess.run([*chromium_args(binary, width, height), "--virtual-time-budget=10000", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(rf'<pre id="{REPORT_ID}">(.*?)</pre>', out.stdout, re.S)
    if not m:
        raise RuntimeError(f"{page}: no report from Chromium (exit {out.returncode}): {out.stderr[-500:]}")
    return json.loads(html.unescape(m.group(1)))


def problems_of(name: str, report: dict, home: bool) -> tuple[list[str], list[str]]:
    """(problems, information lines) of one page's report."""
    problems, info = [], []
    for t in report["tables"]:
        if t["scroll_width"] > t["client_width"] + 1:
            problems.append(f"{name}: table under {t['heading']!r} ({t['header']} ...) scrolls sideways: "
                            f"{t['scroll_width']} px of content in {t['client_width']} px")
    for img in report.get("images", []):
        if img["natural_width"] and img["shown_width"] < MIN_FIGURE_SCALE * img["natural_width"]:
            problems.append(f"{name}: figure {img['src']} under {img['heading']!r} is shown at "
                            f"{img['shown_width'] / img['natural_width']:.0%} of its width "
                            f"({img['shown_width']} of {img['natural_width']} px)")
    for c in report["code"]:
        if "quick start" in c["heading"].lower():
            problems.append(f"{name}: quick-start code block under {c['heading']!r} scrolls sideways "
                            f"({c['scroll_width']} px in {c['client_width']} px): {c['first_line']!r}")
            continue
        info.append(f"{name}: code block under {c['heading']!r} scrolls ({c['scroll_width']} px in "
                    f"{c['client_width']} px): {c['first_line']!r}")
    if home:
        for item in report["first_screen"]:
            if not item["found"]:
                problems.append(f"{name}: no {item['name']} on the page")
            elif not item["inside"]:
                problems.append(f"{name}: the {item['name']} is not on the first screen "
                                f"(it spans {item['top']:.0f}-{item['bottom']:.0f} px of {report['height']})")
            else:
                info.append(f"{name}: the {item['name']} is on the first screen "
                            f"({item['top']:.0f}-{item['bottom']:.0f} px of {report['height']})")
    return problems, info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", type=Path, help="a site built by `mkdocs build` (the folder holding index.html)")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=800)
    ap.add_argument("--chromium", help="the Chromium or Chrome binary (default: the first on PATH)")
    ap.add_argument("--screenshot", type=Path, help="also save the home page's first screen as this PNG")
    ns = ap.parse_args(argv)

    binary = find_chromium(ns.chromium)
    if binary is None:
        print("error: no Chromium on PATH (apt-get install chromium, or --chromium PATH)", file=sys.stderr)
        return 2
    if not (ns.site / "index.html").is_file():
        print(f"error: {ns.site}: no index.html (build the site first: mkdocs build --site-dir DIR)",
              file=sys.stderr)
        return 2
    problems, info = [], []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "site"
        shutil.copytree(ns.site, copy)  # the probes go into a copy: the built site stays as it was
        pages = list(PAGES) + sorted(str(p.relative_to(copy)) for s in SECTIONS
                                     for p in (copy / s).glob("*/index.html"))
        for name in pages:
            if not (copy / name).is_file():
                problems.append(f"{name}: not in the site")
                continue
            report = measure(binary, copy / name, ns.width, ns.height)
            p, i = problems_of(name, report, home=name == "index.html")
            problems += p
            info += i
            info.append(f"{name}: {len(report['tables'])} tables measured at {report['width']} x {report['height']}")
        if ns.screenshot:
            subprocess.run([*chromium_args(binary, ns.width, ns.height), f"--screenshot={ns.screenshot.resolve()}",
                            (copy / "index.html").as_uri()], capture_output=True, timeout=120, check=True)
            info.append(f"screenshot of the home page: {ns.screenshot}")
    print("\n".join(info))
    print("\n".join(problems) or f"layout at {ns.width} x {ns.height}: no table scrolls sideways, every figure "
          f"is shown at {MIN_FIGURE_SCALE:.0%} of its width or more, no quick start scrolls; the first screen "
          "holds the result, the diff and the install line")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
