#!/usr/bin/python3
# Every relative Markdown link in README.md and docs/*.md resolves inside the repository: the file
# exists, and a #anchor names a heading (GitHub's slug) of the target page. Exit 1 lists the bad ones.
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def strip_fences(text):
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def strip_code(text):
    return re.sub(r"`[^`\n]*`", "", strip_fences(text))


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    for line in strip_fences(path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        raw = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
        base = slug(raw)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    for line in path.read_text().splitlines():
        found.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return found


def check(page):
    bad = []
    text = page.read_text()
    for m in LINK.finditer(strip_code(text)):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{page.relative_to(ROOT)}: {target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{page.relative_to(ROOT)}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{page.relative_to(ROOT)}: {target}: no heading #{anchor}")
    return bad


pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
bad = [b for p in pages if p.exists() for b in check(p)]
for b in bad:
    print(b)
print(f"{len(pages)} pages, {len(bad)} broken links")
sys.exit(1 if bad else 0)
