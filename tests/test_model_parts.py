"""scripts/model_parts.py: split a file into parts <= the limit, join them back byte for byte;
a missing part or a corrupted one is a one-line error and leaves nothing at the output."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "model_parts.py"
spec = importlib.util.spec_from_file_location("model_parts", SCRIPT)
model_parts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model_parts)


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 300_001, dtype=np.uint8).tobytes())
    return path


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


@pytest.mark.parametrize("first_part, max_part, n_parts", [
    (100_000, 100_000, 4), (60_000, 120_000, 4), (300_001, 1 << 20, 1), (1 << 20, 1 << 20, 1), (299_999, 10, 2)])
def test_split_then_join_gives_the_same_bytes(model, tmp_path, first_part, max_part, n_parts):
    written = model_parts.split(model, tmp_path / "parts", max_part_bytes=max_part, first_part_bytes=first_part)
    parts = sorted((p for p in written if ".part" in p.name), key=lambda p: int(p.name.rsplit("part", 1)[1]))
    assert len(parts) == n_parts
    assert parts[0].stat().st_size <= first_part
    assert all(p.stat().st_size <= max_part for p in parts[1:])
    assert sum(p.stat().st_size for p in parts) == model.stat().st_size
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    joined = model_parts.join(tmp_path / "parts", out_dir)
    assert joined == out_dir / "tiny.gguf"
    assert joined.read_bytes() == model.read_bytes()


def test_cli_round_trip_to_a_file_path(model, tmp_path):
    r = run_cli("split", model, tmp_path / "parts")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "parts" / "tiny.gguf.sha256").read_text().startswith(
        model_parts.hashlib.sha256(model.read_bytes()).hexdigest())
    r = run_cli("join", tmp_path / "parts", tmp_path / "x" / "joined.gguf")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "x" / "joined.gguf")
    assert (tmp_path / "x" / "joined.gguf").read_bytes() == model.read_bytes()


def test_the_default_model_travels_in_two_calls():
    """Part 0 with the wheels and the tree, part 1 with the tree: each call under 64 MiB."""
    call = 64 << 20
    wheels, tree = 15 << 20, 8 << 20   # .whl is 14.7 MB, the carried tree ~7 MB
    sizes = model_parts.part_sizes(98_362_432)  # SmolLM2-135M-Instruct.Q4_1.gguf
    assert len(sizes) == 2 and sum(sizes) == 98_362_432
    assert sizes[0] + wheels + tree <= call and sizes[1] + tree <= call


def test_missing_part_is_a_one_line_error(model, tmp_path):
    model_parts.split(model, tmp_path / "parts", max_part_bytes=100_000, first_part_bytes=100_000)
    (tmp_path / "parts" / "tiny.gguf.part2").unlink()
    r = run_cli("join", tmp_path / "parts", tmp_path / "joined.gguf")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "missing part(s) tiny.gguf.part2" in r.stderr
    assert not (tmp_path / "joined.gguf").exists()


def test_corrupted_part_is_a_one_line_error(model, tmp_path):
    model_parts.split(model, tmp_path / "parts", max_part_bytes=100_000, first_part_bytes=100_000)
    part = tmp_path / "parts" / "tiny.gguf.part1"
    data = bytearray(part.read_bytes())
    data[12345] ^= 1
    part.write_bytes(bytes(data))
    r = run_cli("join", tmp_path / "parts", tmp_path / "joined.gguf")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "sha256" in r.stderr
    assert not (tmp_path / "joined.gguf").exists() and not list(tmp_path.glob("joined.gguf*"))


def test_no_manifest_and_missing_model_are_one_line_errors(model, tmp_path):
    (tmp_path / "empty").mkdir()
    r = run_cli("join", tmp_path / "empty", tmp_path / "joined.gguf")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "manifest" in r.stderr
    r = run_cli("split", tmp_path / "nope.gguf", tmp_path / "parts")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "no such file" in r.stderr
