"""Split a model file into parts small enough for one device call, and join them back there.

A device call carries at most 64 MiB of files, and the default model (SmolLM2-135M Q4_1) is 94 MiB,
so it travels in parts over consecutive calls to the same warm machine (shared/device/README.md).
Part 0 is small enough to travel with the wheels (.whl, ~15 MB) and the working tree (~7 MB) in the
call that installs; every later part travels with the tree alone, so the default model takes two
calls, the first of them the install:

    python scripts/model_parts.py split MODEL.gguf .models    # .models/NAME.part0, .part1, NAME.sha256
    python scripts/model_parts.py join .models OUT            # OUT: a file, or a directory for OUT/NAME

`join` checks the sha256 of the whole file and prints the joined file's path. A missing part or a
wrong hash is a one-line error (exit 1), and nothing is left at OUT.
The manifest NAME.sha256 is two lines: `HEX  NAME` (as sha256sum writes it), then `parts=N bytes=B`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

FIRST_PART_BYTES = 40 << 20   # part 0: with the wheels and the tree in a 64 MiB call
MAX_PART_BYTES = 56 << 20     # every later part: with the tree
BLOCK = 1 << 20


class PartsError(Exception):
    """Bad input: reported as one line, never a traceback."""


def part_sizes(size: int, first_part_bytes: int = FIRST_PART_BYTES, max_part_bytes: int = MAX_PART_BYTES) -> list[int]:
    """Bytes of each part: the first at most first_part_bytes, the rest near-equal, each at most
    max_part_bytes; one part when the whole file fits the first."""
    if size <= first_part_bytes:
        return [size]
    rest = size - first_part_bytes
    n = -(-rest // max_part_bytes)
    return [first_part_bytes] + [rest // n + (i < rest % n) for i in range(n)]


def split(model: Path, out_dir: Path, max_part_bytes: int = MAX_PART_BYTES,
          first_part_bytes: int = FIRST_PART_BYTES) -> list[Path]:
    """Write out_dir/NAME.part0..partN-1 (sizes from part_sizes) and NAME.sha256."""
    if not model.is_file():
        raise PartsError(f"no such file: {model}")
    size = model.stat().st_size
    sizes = part_sizes(size, first_part_bytes, max_part_bytes)
    n_parts = len(sizes)
    out_dir.mkdir(parents=True, exist_ok=True)
    digest, parts = hashlib.sha256(), []
    with model.open("rb") as src:
        for i, part_bytes in enumerate(sizes):
            part = out_dir / f"{model.name}.part{i}"
            with part.open("wb") as dst:
                left = part_bytes
                while left and (block := src.read(min(BLOCK, left))):
                    digest.update(block)
                    dst.write(block)
                    left -= len(block)
            parts.append(part)
    manifest = out_dir / f"{model.name}.sha256"
    manifest.write_text(f"{digest.hexdigest()}  {model.name}\nparts={n_parts} bytes={size}\n")
    return parts + [manifest]


def read_manifest(manifest: Path) -> tuple[str, str, int, int]:
    """(sha256 hex, file name, number of parts, total bytes)."""
    try:
        first, second = manifest.read_text().splitlines()[:2]
        hex_digest, name = first.split(maxsplit=1)
        fields = dict(item.split("=") for item in second.split())
        return hex_digest, name.strip(), int(fields["parts"]), int(fields["bytes"])
    except (ValueError, KeyError) as e:
        raise PartsError(f"{manifest} is not a model_parts manifest ({e})") from None


def join(parts_dir: Path, out: Path) -> Path:
    """Reassemble the one model whose manifest is in parts_dir; returns the joined file's path."""
    manifests = sorted(parts_dir.glob("*.sha256"))
    if len(manifests) != 1:
        found = ", ".join(m.name for m in manifests) or "none"
        raise PartsError(f"{parts_dir} must hold exactly one *.sha256 manifest (found {found})")
    want, name, n_parts, size = read_manifest(manifests[0])
    parts = [parts_dir / f"{name}.part{i}" for i in range(n_parts)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise PartsError(f"missing part(s) {', '.join(missing)} in {parts_dir}: carry every part "
                         f"(each call's carried files stay on the warm machine)")
    target = out / name if out.is_dir() else out
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".joining")
    digest = hashlib.sha256()
    with tmp.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(BLOCK):
                    digest.update(block)
                    dst.write(block)
    got, got_size = digest.hexdigest(), tmp.stat().st_size
    if got != want or got_size != size:
        tmp.unlink()
        raise PartsError(f"{name}: the joined parts give {got_size} bytes, sha256 {got[:16]}..., but the "
                         f"manifest wants {size} bytes, {want[:16]}...: a part is stale or truncated")
    os.replace(tmp, target)  # atomic: a failed join never leaves a half file at target
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("split", help="MODEL DIR: write DIR/NAME.part0.. and DIR/NAME.sha256")
    p.add_argument("model", type=Path)
    p.add_argument("dir", type=Path)
    p = sub.add_parser("join", help="DIR OUT: reassemble, check the sha256, print the joined path")
    p.add_argument("dir", type=Path)
    p.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "split":
            for path in split(args.model, args.dir):
                print(path)
        else:
            print(join(args.dir, args.out))
    except (PartsError, OSError) as e:
        print(f"model_parts: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
