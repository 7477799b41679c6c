"""`make docs`: regenerate every example table and image in README.md and docs/ from kvsim itself.

Why: numbers pasted into docs go stale the day the model changes (issue 20: docs/capacity.md showed
1.42 req/s where kvsim said 1.19, and the report pictures predated the out-of-window column). Every
generated piece sits between two markers, and this script rewrites only what is between them:

    <!-- generated: KIND ARGS -->
    ...
    <!-- /generated -->

KIND is one of:
- `file PATH`: the file's text (relative to the repository), in a fence named after its suffix, so
  an example in the docs is the file the repository ships (tests/docs check these are current);
- `output kvsim ...`: the command's standard output, in a ```text fence;
- `capacity-table kvsim capacity ...`: the command run with `--output plan.json`, its rows as a
  Markdown table (allocator, max_model_len, concurrency, max rate).

Images: `docs/img/taxonomy.png` is figure 1 of the default comparison (`kvsim compare`, i.e.
`make demo`) and `docs/img/report.png` the top of its report.html in headless Chromium (1280 x 1400
px, Debian's /usr/bin/chromium through Playwright, as tests/reports/test_report_browser.py opens it).
Without Chromium the script stops before running anything, naming what is missing;
`--no-screenshot` keeps the old report.png.

Usage: `python docs/generate.py [--check] [--no-screenshot] [--no-images]`. `--check` changes nothing and
exits 1 naming each region that differs (for `file` regions it needs no simulation).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# docs/ is a folder of scripts, not a package: its sibling module runs kvsim for both this script and
# tests/docs (one way to run a documented command).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_commands import run_kvsim

REPO_ROOT = Path(__file__).resolve().parent.parent
IMG_DIR = REPO_ROOT / "docs" / "img"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
SCREENSHOT_VIEWPORT_PX = {"width": 1280, "height": 1400}

REGION = re.compile(
    r"(?P<open><!-- generated: (?P<kind>[\w-]+) (?P<args>[^\n]*?) -->\n)"
    r"(?P<body>.*?)(?P<close><!-- /generated -->)",
    re.DOTALL,
)
FENCE_LANGUAGES = {".toml": "toml", ".json": "json", ".py": "python", ".csv": "csv"}


class DocsError(Exception):
    """A region or command that cannot be generated: one line naming the file and the marker."""


@dataclass(frozen=True)
class Region:
    path: Path
    kind: str
    args: str
    body: str

    @property
    def where(self) -> str:
        shown = self.path.relative_to(REPO_ROOT) if self.path.is_relative_to(REPO_ROOT) else self.path
        return f"{shown}: <!-- generated: {self.kind} {self.args} -->"


def doc_files() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def regions(path: Path) -> list[Region]:
    text = path.read_text(encoding="utf-8")
    return [
        Region(path, m.group("kind"), m.group("args").strip(), m.group("body")) for m in REGION.finditer(text)
    ]


def kvsim(argv: list[str], cwd: Path) -> str:
    """Run `kvsim ARGS` in its own process (as a reader would) and return its standard output."""
    if argv[:1] != ["kvsim"]:
        raise DocsError(f"not a kvsim command: {' '.join(argv)}")
    done = run_kvsim(argv, cwd)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise DocsError(f"`{' '.join(argv)}` exited {done.returncode}: {last}")
    return done.stdout


def file_body(region: Region, _work: Path) -> str:
    source = REPO_ROOT / region.args
    if not source.is_file():
        raise DocsError(f"{region.where}: {region.args} does not exist")
    language = FENCE_LANGUAGES.get(source.suffix, "")
    return f"```{language}\n{source.read_text(encoding='utf-8').rstrip()}\n```\n"


def output_body(region: Region, work: Path) -> str:
    printed = kvsim(shlex.split(region.args), work)
    lines = [line.rstrip() for line in printed.rstrip().splitlines()]
    return "```text\n" + "\n".join(lines) + "\n```\n"


CAPACITY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, plan.json row key, format)
    ("allocator", "allocator", "s"),
    ("max_model_len", "max_model_len", "d"),
    ("conc. peak", "max_concurrency", "d"),
    ("conc. sustained", "sustained_concurrency", ".1f"),
    ("saturation req/s", "saturation_throughput_req_s", ".3g"),
    ("max rate req/s", "max_rate_req_s", ".3g"),
    ("confirmed p99 TTFT ms", "confirmation_p99_ttft_ms", ",.0f"),
    ("confirmed p99 TPOT ms", "confirmation_p99_tpot_ms", ",.1f"),
)


def capacity_body(region: Region, work: Path) -> str:
    argv = shlex.split(region.args)
    plan_path = work / "plan.json"
    kvsim([*argv, "--output", str(plan_path)], work)
    rows = json.loads(plan_path.read_text(encoding="utf-8"))["rows"]
    lines = [
        "| " + " | ".join(header for header, _, _ in CAPACITY_COLUMNS) + " |",
        "|" + "|".join(":---" if kind == "s" else "---:" for _, _, kind in CAPACITY_COLUMNS) + "|",
    ]
    for row in rows:
        cells = []
        for header, key, kind in CAPACITY_COLUMNS:
            if key not in row:
                raise DocsError(f"{region.where}: plan.json rows have no key {key!r} (column {header!r})")
            value = row[key]
            cells.append("–" if value is None else format(value, kind))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


GENERATORS: dict[str, Callable[[Region, Path], str]] = {
    "file": file_body,
    "output": output_body,
    "capacity-table": capacity_body,
}


def regenerate(path: Path, work: Path, kinds: set[str]) -> list[str]:
    """Rewrite the regions of `path` whose kind is in `kinds`; the names of those that changed."""
    text = path.read_text(encoding="utf-8")
    changed: list[str] = []

    def replace(match: re.Match[str]) -> str:
        region = Region(path, match.group("kind"), match.group("args").strip(), match.group("body"))
        if region.kind not in GENERATORS:
            raise DocsError(f"{region.where}: unknown kind (known: {', '.join(GENERATORS)})")
        if region.kind not in kinds:
            return match.group(0)
        body = GENERATORS[region.kind](region, work)
        if body != region.body:
            changed.append(region.where)
        return match.group("open") + body + match.group("close")

    new_text = REGION.sub(replace, text)
    if new_text != text:
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(new_text, encoding="utf-8")
        os.replace(temporary, path)
    return changed


def stale_regions(path: Path, work: Path, kinds: set[str]) -> list[str]:
    """The regions of `path` (of `kinds`) whose text differs from what would be generated now."""
    return [
        region.where
        for region in regions(path)
        if region.kind in kinds and GENERATORS[region.kind](region, work) != region.body
    ]


def screenshot(html_path: Path, target: Path) -> None:
    """The top of a report in headless Chromium, as a reader's 1280-px window shows it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport=SCREENSHOT_VIEWPORT_PX)
            page.goto(html_path.as_uri(), wait_until="load")
            page.screenshot(path=str(target))
        finally:
            browser.close()


def check_screenshot_tools() -> None:
    if not CHROMIUM.exists():
        raise DocsError(
            f"report.png needs Chromium at {CHROMIUM} (apt-get install chromium), or --no-screenshot"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        raise DocsError(
            "report.png needs Playwright for Python (pip install playwright), or --no-screenshot"
        ) from None


def regenerate_images(work: Path, take_screenshot: bool) -> list[str]:
    """docs/img/taxonomy.png and report.png from the default comparison (what `make demo` runs)."""
    compare_dir = work / "compare"
    kvsim(["kvsim", "compare", "--quiet", "--output", str(compare_dir)], work)
    written = []
    new_taxonomy = compare_dir / "figures" / "fig1_taxonomy.png"
    shutil.copyfile(new_taxonomy, IMG_DIR / ".taxonomy.png.tmp")
    os.replace(IMG_DIR / ".taxonomy.png.tmp", IMG_DIR / "taxonomy.png")
    written.append("docs/img/taxonomy.png")
    if take_screenshot:
        temporary = IMG_DIR / ".report.png.tmp.png"
        screenshot(compare_dir / "report.html", temporary)
        os.replace(temporary, IMG_DIR / "report.png")
        written.append("docs/img/report.png")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a region is stale")
    parser.add_argument("--no-screenshot", action="store_true", help="keep docs/img/report.png")
    parser.add_argument("--no-images", action="store_true", help="regions only, no docs/img/ files")
    parser.add_argument("--kinds", default=",".join(GENERATORS), help="region kinds to regenerate")
    args = parser.parse_args(argv)
    kinds = {kind.strip() for kind in args.kinds.split(",") if kind.strip()}
    try:
        unknown = kinds - set(GENERATORS)
        if unknown:
            raise DocsError(f"--kinds: unknown {', '.join(sorted(unknown))} (known: {', '.join(GENERATORS)})")
        images = not args.no_images and not args.check
        if images and not args.no_screenshot:
            check_screenshot_tools()  # before minutes of simulation, not after
        with tempfile.TemporaryDirectory(prefix="kvsim-docs-") as folder:
            work = Path(folder)
            if args.check:
                stale = [where for path in doc_files() for where in stale_regions(path, work, kinds)]
                for where in stale:
                    print(f"stale: {where} (run `make docs`)", file=sys.stderr)
                return 1 if stale else 0  # --check changes nothing
            for path in doc_files():
                for where in regenerate(path, work, kinds):
                    print(f"updated {where}")
            if images:
                for name in regenerate_images(work, take_screenshot=not args.no_screenshot):
                    print(f"wrote {name}")
    except DocsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("docs are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
