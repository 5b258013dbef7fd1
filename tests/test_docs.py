"""The docs hold together: every relative link in README.md and docs/*.md reaches a file that exists, and
every #anchor a heading of its page (GitHub's heading slugs); no prose line is wider than 110 characters
(tables and fenced code may be); README stays short and links every page, each page stays under about
300 lines and opens with a sentence saying what it is for."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
WIDTH = 110
README_MAX_LINES = 200
PAGE_MAX_LINES = 300

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")


def outside_fences(text):
    """The page's lines with those inside fenced code blocks (and the fences) blanked, numbered from 1."""
    out, fence = [], None
    for line in text.split("\n"):
        mark = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if fence is None and mark:
            fence = mark.group(1)[0] * len(mark.group(1))
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def heading_text(raw):
    """A heading as GitHub renders it: links are their text, code spans their content."""
    raw = LINK.sub(lambda m: m.group(1), raw)
    return re.sub(r"`+", "", raw)


def slug(text):
    """GitHub's heading slug: lower case, every character but letters, digits, `_`, `-` and spaces dropped,
    each space a `-`."""
    return re.sub(r"[^\w\- ]", "", heading_text(text).lower()).replace(" ", "-")


def anchors(text):
    """Every heading's anchor on a page, a repeated one numbered as GitHub does (x, x-1, x-2, ...)."""
    seen, out = {}, set()
    for line in outside_fences(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text):
    """(line number, target) of every inline link outside fenced code and code spans."""
    lines = outside_fences(text)
    body = "\n".join(lines)
    body = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), body)
    for m in LINK.finditer(body):
        yield body.count("\n", 0, m.start()) + 1, m.group(2)


def broken_links(page):
    """What does not resolve on one page: 'page:line: target: why' for each link."""
    text = page.read_text()
    problems = []
    for n, target in links(text):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.name}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            problems.append(f"{where}: no heading #{anchor} in {dest.name}")
    return problems


def wide_lines(page):
    """Prose lines wider than WIDTH (table rows and fenced code are left as they are)."""
    return [f"{page.name}:{n}: {len(line)} characters" for n, line in enumerate(outside_fences(page.read_text()), 1)
            if len(line) > WIDTH and not line.lstrip().startswith("|")]


def test_slugs_follow_githubs_rules():
    assert slug("Watching it: `doit top`") == "watching-it-doit-top"
    assert slug("At the watchdog's defaults") == "at-the-watchdogs-defaults"
    assert slug("Faults one after another, under load: the chaos soak") == (
        "faults-one-after-another-under-load-the-chaos-soak")
    assert slug("Benchmarks: `make bench` and `make faults`") == "benchmarks-make-bench-and-make-faults"
    assert slug("R<N>_IP and [links](x.md)") == "rn_ip-and-links"
    assert anchors("# A\n## B\n```\n# not a heading\n```\n## B\n### b\n") == {"a", "b", "b-1", "b-2"}


def test_the_link_checker_catches_a_broken_anchor_and_a_missing_file(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Here\n\n"
                    "[fine](other.md#a-section), [fine too](#here), [outside](https://example.org/#x)\n"
                    "[bad anchor](other.md#no-such-section) and [bad here](#nowhere)\n"
                    "[no file](missing.md) and `[in code](missing-too.md)`\n"
                    "```\n[in a fence](missing-three.md)\n```\n"
                    "[a link over\ntwo lines](other.md#gone)\n")
    assert broken_links(page) == [
        "page.md:6: other.md#no-such-section: no heading #no-such-section in other.md",
        "page.md:6: #nowhere: no heading #nowhere in page.md",
        f"page.md:7: missing.md: no file {tmp_path / 'missing.md'}",
        "page.md:11: other.md#gone: no heading #gone in other.md",
    ]


def test_every_link_and_anchor_resolves():
    assert PAGES, "no docs/*.md"
    assert [p for page in [README, *PAGES] for p in broken_links(page)] == []


def test_no_prose_line_is_wider_than_110_characters():
    assert [w for page in [README, *PAGES] for w in wide_lines(page)] == []


def test_readme_and_pages_stay_short():
    assert len(README.read_text().splitlines()) <= README_MAX_LINES
    assert [f"{p.name}: {n} lines" for p in PAGES
            if (n := len(p.read_text().splitlines())) > PAGE_MAX_LINES] == []


def test_readme_links_every_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for _, t in links(README.read_text()) if not EXTERNAL.match(t)}
    assert [p.name for p in PAGES if p.resolve() not in linked] == []


def test_each_page_opens_with_its_title_and_what_it_is_for():
    for page in PAGES:
        lines = [line for line in page.read_text().splitlines() if line.strip()]
        assert lines[0].startswith("# ") and not lines[1].startswith(("#", "|", "```", "- ")), page.name
