"""The docs hold together: docs/index.md reaches every page, README.md stays a short front door, and
every relative link in README.md and docs/ lands on a file and, for a Markdown page, on a heading."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
README = ROOT / "README.md"

README_MAX_LINES = 150  # a front door: what flowstat is, two commands, what people do, where things are
BENCHMARKS_MAX_LINES = 300  # the current figures and how to rerun them; their history is git's

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) and ![alt](target), the text holding one level of brackets at most; these docs use no
# reference-style links ([text][name])
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks: a `#` or a [x](y) inside one is code, not Markdown."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: links reduced to their text, then lowercase, every
    character but letters, digits, `_`, `-` and spaces dropped, spaces made `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page's text has: its headings' slugs, the second of a name `-1`, the third `-2`,
    as GitHub numbers them, and explicit <a name=...> / <a id=...>."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        if m := HEADING.match(line):
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def links(page: Path) -> list[str]:
    """The relative link targets of a page (web addresses and mail left out), in prose only."""
    targets = []
    for line in prose_lines(page.read_text()):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
                targets.append(target)
    return targets


def resolve(page: Path, target: str) -> tuple[Path, str]:
    """A link's file (the page itself for `#anchor` alone) and its anchor ('' when none)."""
    path, _, anchor = target.partition("#")
    return (page.parent / path).resolve() if path else page, anchor


def doc_pages() -> list[Path]:
    # docs/campaigns/: make bench's pages, not tracked (docs/campaigns.md says so)
    return sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] != "campaigns")


def test_every_doc_is_reachable_from_the_index():
    # Followed only through pages of docs/: the index is the docs' entry, so a page reached only by way
    # of README.md or a folder's README would be one a reader of the docs does not find.
    seen, todo = {INDEX.resolve()}, [INDEX.resolve()]
    while todo:
        page = todo.pop()
        for target in links(page):
            path, _ = resolve(page, target)
            if path.suffix == ".md" and path.is_relative_to(DOCS) and path.is_file() and path not in seen:
                seen.add(path)
                todo.append(path)
    unreachable = [str(p.relative_to(ROOT)) for p in doc_pages() if p.resolve() not in seen]
    assert not unreachable, f"not linked from docs/index.md, directly or through a page it links: {unreachable}"


def test_readme_is_a_short_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md: move reference material into docs/"
    assert re.search(r"^```mermaid\s*$", text, re.M), "README.md: the data path as a ```mermaid diagram"
    assert INDEX.resolve() in [resolve(README, t)[0] for t in links(README)], "README.md: link docs/index.md"


def test_benchmarks_page_holds_current_figures_only():
    lines = (DOCS / "benchmarks.md").read_text().splitlines()
    assert len(lines) <= BENCHMARKS_MAX_LINES, "docs/benchmarks.md: keep each benchmark's newest figures"


def test_every_relative_link_lands():
    broken = []
    for page in [README, *doc_pages()]:
        for target in links(page):
            path, anchor = resolve(page, target)
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not path.exists():
                broken.append(f"{where}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def test_slugs_are_githubs():
    # The cases this repository's headings meet: punctuation, code, links, a repeated heading.
    assert slug("Why the merger got faster (issue 9)") == "why-the-merger-got-faster-issue-9"
    assert slug("Elasticsearch's rollup") == "elasticsearchs-rollup"
    assert slug("With Docker: docker-compose.yml") == "with-docker-docker-composeyml"
    assert slug("The run-ending notice: STOPPED, not DOWN") == "the-run-ending-notice-stopped-not-down"
    assert slug("State fields (`check-state`, and every reply but errors)") == (
        "state-fields-check-state-and-every-reply-but-errors"
    )
    assert slug("5.2 and 5.2.1 Object size") == "52-and-521-object-size"
    assert slug("Soak: [the hour](soak.md) again") == "soak-the-hour-again"
    page = "# Docs\n## Secured channels\n```\n# a comment\n```\n## Secured channels\n"
    assert anchors(page) == {"docs", "secured-channels", "secured-channels-1"}
