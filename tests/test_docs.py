"""Doc references in code and docs point at something that exists.

- No reference to a DESIGN.md: the design is docs/design.md, in the repository.
- Every docs/<file> named exists, and so does every file a docs/*.md links to.
- Every `design.md §N` (or §N.M) has its heading in docs/design.md ("## N." / "### N.M"), and
  every `§N rule M` names a numbered rule "M." of that section.
- Every `<doc>.md, "Name"` of a file in docs/ and every `<doc>.md round N` names a heading of it.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SUFFIXES = {".py", ".cu", ".cuh", ".sh", ".md", ".tcss"}


def sources() -> list[Path]:
    files = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    for d in ("engine", "memra_tui", "cuda", "scripts", "tests"):
        files += sorted(p for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and p.is_file())
    return [p for p in files if p != Path(__file__).resolve()]


def texts() -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), p.read_text(errors="replace")) for p in sources()]


def headings(path: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]


def design_sections() -> tuple[set[str], dict[str, set[str]]]:
    """Section numbers of docs/design.md, and the numbered rules (top-level "M. " items) of each."""
    sections, rules, current = set(), {}, None
    for line in (DOCS / "design.md").read_text().splitlines():
        m = re.match(r"^(#{2,3}) (\d+(?:\.\d+)*)\.?\s", line)
        if m:
            sections.add(m.group(2))
            if len(m.group(1)) == 2:
                current = m.group(2)
            continue
        m = re.match(r"^(\d+)\. ", line)
        if m and current is not None:
            rules.setdefault(current, set()).add(m.group(1))
    return sections, rules


def test_nothing_points_to_a_design_md_outside_the_repository():
    hits = [f"{name}:{text[:m.start()].count(chr(10)) + 1}" for name, text in texts()
            for m in re.finditer(r"(?<![\w/.-])DESIGN\.md", text)]
    assert hits == []


def test_named_doc_files_exist():
    missing = []
    for name, text in texts():
        for m in re.finditer(r"(?<![\w/.-])docs/([\w.-]+\.(?:md|svg))", text):
            if not (DOCS / m.group(1)).is_file():
                missing.append(f"{name}: docs/{m.group(1)}")
    for p in DOCS.glob("*.md"):
        for m in re.finditer(r"\]\(([\w.-]+\.md)(?:#[\w-]*)?\)", p.read_text()):
            if not (DOCS / m.group(1)).is_file():
                missing.append(f"docs/{p.name}: {m.group(1)}")
    assert missing == []


def test_design_md_sections_and_rules_cited_exist():
    sections, rules = design_sections()
    assert {"1", "2", "3", "4", "5", "6", "7"} <= sections
    bad = []
    ref = re.compile(r"design\.md\s+§(\d+(?:\.\d+)*)((?:\s+rules?\s+\d+(?:(?:,\s*|\s+and\s+)\d+)*)?)")
    for name, text in texts():
        for m in ref.finditer(text):
            section, cited_rules = m.group(1), re.findall(r"\d+", m.group(2))
            if section not in sections:
                bad.append(f"{name}: §{section}")
            bad += [f"{name}: §{section} rule {r}" for r in cited_rules if r not in rules.get(section, set())]
    assert bad == []


def test_cited_headings_of_docs_exist():
    docs = {p.name: [h.lower() for h in headings(p)] for p in DOCS.glob("*.md")}
    bad = []
    for name, text in texts():
        for m in re.finditer(r"(?<![\w.-])(?:docs/)?([\w-]+\.md),\s*\"([^\"\n]+)\"", text):
            doc, title = m.group(1), m.group(2).lower()
            if doc in docs and not any(title in h for h in docs[doc]):
                bad.append(f'{name}: {doc}, "{m.group(2)}"')
        for m in re.finditer(r"(?<![\w.-])(?:docs/)?([\w-]+\.md),?\s+rounds?\s+(\d+)", text):
            doc = m.group(1)
            if doc in docs and not any(f"round {m.group(2)} " in h + " " or f"round {m.group(2)}," in h
                                       for h in docs[doc]):
                bad.append(f"{name}: {doc} round {m.group(2)}")
    assert bad == []
