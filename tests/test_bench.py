"""`memra-bench` as a user runs it, on a tiny synthetic model (one run each, so it is quick)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tiny_models import tiny_llama_path  # noqa: F401  (fixture)


def memra_bench(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "memra-bench"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "memra_engine.bench"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=300)


def test_bench_json_has_the_keys(tiny_llama_path):
    run = memra_bench(str(tiny_llama_path), "--backend", "cpu", "--json", "--runs", "1", "--n-prompt", "64",
                      "--n-gen", "16")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["backend"] == "cpu" and result["model"] == tiny_llama_path.name
    # the key names follow the sizes asked for; the defaults give pp512 / tg128
    for key in ("pp64_tok_s", "tg16_tok_s", "peak_rss_mb"):
        assert isinstance(result[key], float) and result[key] > 0, key
    assert result["peak_rss_mb"] < 4096


def test_bench_default_sizes_give_the_documented_keys(tiny_llama_path):
    run = memra_bench(str(tiny_llama_path), "--backend", "cpu", "--json", "--runs", "1", "--ctx-depth", "32")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert {"pp512_tok_s", "tg128_tok_s", "tg128_at_32_tok_s", "peak_rss_mb", "backend", "model"} <= set(result)


def test_bench_table_and_bad_file(tmp_path, tiny_llama_path):
    run = memra_bench(str(tiny_llama_path), "--backend", "cpu", "--runs", "1", "--n-prompt", "16", "--n-gen", "4")
    assert run.returncode == 0, run.stderr
    assert "pp16_tok_s" in run.stdout and "peak_rss_mb" in run.stdout
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(100))
    bad = memra_bench(str(junk), "--backend", "cpu")
    assert bad.returncode == 1 and bad.stderr.startswith("memra-bench: error: ") and "Traceback" not in bad.stderr


def test_bench_table_shows_vram_regions_one_per_line(capsys):
    from memra_engine.bench import print_table

    print_table({"model": "m.gguf", "backend": "cuda", "kv_type": "f16", "runs": 5, "pp512_tok_s": 1234.5,
                 "vram_regions_mib": {"weights": {"used": 4258.0, "reserved": 4300.0},
                                      "kv": {"used": 512.0, "reserved": 544.0}}})
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["pp512_tok_s", "1,234.5"]
    assert out[2].strip() == "vram_regions_mib"
    assert out[3].split() == ["weights", "4,258.0", "used", "of", "4,300.0"]
    assert out[4].split() == ["kv", "512.0", "used", "of", "544.0"]
