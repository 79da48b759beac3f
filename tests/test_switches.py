"""Every MEMRA_* switch is in one module (the engine's) and one README table (all of them)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"MEMRA_[A-Z][A-Z0-9_]*")


def names_in(paths) -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for p in paths:
        for name in NAME.findall(p.read_text(errors="replace")):
            found.setdefault(name, set()).add(p)
    return found


def test_the_engine_reads_its_switches_in_one_module():
    """No environment read of a MEMRA_* name in engine/ or memra_tui/ outside engine/switches.py
    (comments may name them)."""
    reads = []
    for p in sorted((ROOT / "engine").rglob("*.py")) + sorted((ROOT / "memra_tui").rglob("*.py")):
        if p.name == "switches.py":
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if NAME.search(line) and ("environ" in line or "getenv" in line):
                reads.append(f"{p.relative_to(ROOT)}:{n}")
    assert reads == []
    assert {"MEMRA_PDL", "MEMRA_ATTN_CLUSTER", "MEMRA_BATCHED_R"} <= set(NAME.findall((ROOT / "engine/switches.py").read_text()))


def test_the_readme_table_lists_every_switch():
    code = names_in([p for d in ("engine", "memra_tui", "scripts", "tests") for p in sorted((ROOT / d).rglob("*"))
                     if p.suffix in (".py", ".sh") and p.name != "test_switches.py"])
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("### Switches"):]
    table = table[:table.index("\n\n", table.index("| variable |"))]
    assert sorted(set(code) - set(NAME.findall(table))) == []
    assert set(code)  # the scan found the switches at all
