"""README.md and docs/ as a reader meets them: every relative link lands on a file and heading that
exist, no reference page carries a date (run history belongs in docs/benchmarks.md, generated, and
in the decision records of docs/design/), and the README stays a short guide."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
DATED = (ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "design")
README_MAX_LINES = 160
README_MAX_CHARS = 12_000

MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December"
    "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
DATE = re.compile(
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b"  # 2026-12-04
    rf"|\b(?:{MONTHS})\.? \d{{1,2}}(?:st|nd|rd|th)?\b"  # December 4, Dec 4th
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)? (?:{MONTHS})\b"  # 4 December
    rf"|\b(?:{MONTHS}) \d{{4}}\b"  # December 2026
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(path.read_text()):
        if match := re.match(r"#{1,6} +(.*?) *#* *$", line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in prose(path.read_text()):
        for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = match.group(1) or match.group(2)
            if re.fullmatch(r"[\w./-]*(#[\w-]*)?", target):  # not http:, mailto: or a regex in prose
                out.append((number, target))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands_on_a_file_and_heading(page: Path) -> None:
    broken = []
    for number, target in links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{number}: {target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    "page", [p for p in PAGES if not any(p == d or d in p.parents for d in DATED)], ids=lambda p: p.name
)
def test_no_reference_page_carries_a_date(page: Path) -> None:
    dated = [
        f"{n}: {line.strip()[:100]}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if DATE.search(line)
    ]
    where = page.relative_to(ROOT)
    assert not dated, f"{where} carries dates (history goes to docs/design/):\n" + "\n".join(dated)


def test_each_decision_record_is_dated_once_in_its_first_line() -> None:
    records = sorted(p for p in (ROOT / "docs" / "design").glob("*.md") if p.name != "README.md")
    assert records
    for record in records:
        dated = [n for n, line in enumerate(record.read_text().splitlines(), 1) if DATE.search(line)]
        assert dated == [1], f"{record.name}: dated on lines {dated}, not once in its first line"


def test_the_readme_is_a_short_guide() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert len(text) <= README_MAX_CHARS


@pytest.mark.parametrize(
    ("line", "dated"),
    [
        ("measured 2026-12-04 at noon", True),
        ("on December 4 it was", True),
        ("the 4th December run", True),
        ("in Dec 2026", True),
        ("a 2,048-block tier, 16-token blocks", False),
        ("may 5 replicas", False),
        ("`block_size` 16, port 8000", False),
    ],
)
def test_the_date_pattern(line: str, dated: bool) -> None:
    assert bool(DATE.search(line)) is dated
