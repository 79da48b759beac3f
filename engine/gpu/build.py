"""Build the CUDA kernel families in cuda/ into fatbins, once, and cache them.

One fatbin per family (one `cuda/<family>.cu`), holding SASS for every arch asked for plus
compute_80 PTX when the full set is built. A fatbin is looked up in this order:

1. prebuilt in the package: `memra_engine.kernels/prebuilt/<family>.fatbin` with a
   `<family>.key` beside it holding the source hash it was built from (used only if it matches);
2. the user cache: `user_cache_dir("memra")/kernels/<family>-<key>.fatbin`, where key hashes
   every cuda source, the arch list and the nvcc version;
3. nvcc, writing into the user cache (atomically: temp file, then rename).

The source hash covers all of cuda/*.cu and *.cuh, so editing a shared header rebuilds every
family. Kernel signatures for the registry are parsed from the same sources (`kernel_signatures`).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Sequence

from memra_engine.errors import DeviceError

ALL_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_120")
PTX_ARCH = "compute_80"  # forward-compatible PTX for archs newer than any SASS we ship
NVCC_FLAGS = ("-O3", "-std=c++17", "--extended-lambda", "-Xptxas=-O3")

Progress = Callable[[str], None] | None


def source_dir() -> Path:
    """The kernel sources, wherever the package is installed (editable or wheel)."""
    return Path(str(resources.files("memra_engine.kernels")))


def kernel_families() -> list[str]:
    """Stems of cuda/*.cu: one fatbin each."""
    return sorted(p.stem for p in source_dir().glob("*.cu"))


def source_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(source_dir().glob("*.cu*")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def nvcc_available() -> bool:
    return find_nvcc() is not None


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        return "none"
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def arch_for_capability(major: int, minor: int) -> str:
    """The SASS arch we build for a device: sm_90 gets sm_90a (wgmma-capable), 12.x gets sm_120."""
    if major < 8:
        raise DeviceError(f"GPU compute capability {major}.{minor} is below 8.0; memra needs Ampere or newer")
    if major == 9:
        return "sm_90a"
    if major >= 12:
        return "sm_120"
    arch = f"sm_{major}{minor}"
    return arch if arch in ALL_ARCHS else "sm_80"


def has_sm90_features(arch: str) -> bool:
    """Whether kernels built for `arch` carry the sm_90 features the runtime may use (griddepcontrol
    for PDL, thread-block clusters): decided by the built arch, not the device, since a GPU with no
    SASS target of its own runs the sm_80 build (arch_for_capability)."""
    return int(arch.removeprefix("sm_").rstrip("a")) >= 90


def virtual_arch(arch: str) -> str:
    """The PTX an arch's SASS is built from. The kernels branch only on __CUDA_ARCH__ >= 900, so
    sm_86 and sm_89 take compute_80's PTX: the front end (cicc, ~2/3 of a family's build) runs once
    for all of sm_8x."""
    num = arch.removeprefix("sm_")
    return PTX_ARCH if int(num.rstrip("a")) < 90 else f"compute_{num}"


def gencode_flags(archs: Sequence[str], ptx: bool) -> list[str]:
    codes: dict[str, list[str]] = {}
    for arch in archs:
        codes.setdefault(virtual_arch(arch), []).append(arch)
    if ptx:
        codes.setdefault(PTX_ARCH, []).append(PTX_ARCH)
    return [f"-gencode=arch={virt},code=[{','.join(sass)}]" for virt, sass in codes.items()]


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("memra")) / "kernels"


def _cache_key(archs: Sequence[str], ptx: bool) -> str:
    h = hashlib.sha256(f"{source_hash()}|{','.join(archs)}|{ptx}|{nvcc_version()}|{NVCC_FLAGS}".encode())
    return h.hexdigest()[:20]


def _prebuilt(family: str) -> bytes | None:
    pre = source_dir() / "prebuilt"
    fatbin, key = pre / f"{family}.fatbin", pre / f"{family}.key"
    if fatbin.is_file() and key.is_file() and key.read_text().strip() == source_hash():
        return fatbin.read_bytes()
    return None


def write_prebuilt(out: Path, fatbins: dict[str, bytes]) -> None:
    """Lay fatbins out as _prebuilt reads them: `<family>.fatbin` and its `<family>.key`."""
    out.mkdir(parents=True, exist_ok=True)
    for family, data in fatbins.items():
        (out / f"{family}.fatbin").write_bytes(data)
        (out / f"{family}.key").write_text(source_hash())


def compile_family(family: str, archs: Sequence[str], ptx: bool, out: Path, threads: int = 1) -> None:
    """One nvcc call with every -gencode flag. Raises DeviceError with nvcc's first error lines."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise DeviceError("nvcc not found and no prebuilt kernels: install the CUDA toolkit or use --backend cpu")
    src = source_dir() / f"{family}.cu"
    if not src.is_file():
        raise DeviceError(f"no kernel family {family!r} (no {src})")
    cmd = [nvcc, "-fatbin", *NVCC_FLAGS, f"--threads={threads}", *gencode_flags(archs, ptx),
           "-I", str(source_dir()), "-o", str(out), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if "error" in ln] or proc.stderr.splitlines()
        raise DeviceError(f"nvcc failed on {family}.cu: " + " | ".join(errors[:5]))


def build_fatbin(family: str, archs: Sequence[str] | None = None, progress: Progress = None,
                 cache_dir: Path | None = None, threads: int = 1) -> bytes:
    """Fatbin bytes for one family. archs None = ALL_ARCHS + compute_80 PTX."""
    if archs is None or tuple(archs) == ALL_ARCHS:
        archs, ptx = ALL_ARCHS, True
        prebuilt = _prebuilt(family)
        if prebuilt is not None:
            return prebuilt
    else:
        archs, ptx = tuple(archs), False
        prebuilt = _prebuilt(family)  # an all-arch prebuilt covers any single arch
        if prebuilt is not None:
            return prebuilt
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{family}-{_cache_key(archs, ptx)}.fatbin"
    if path.is_file():
        return path.read_bytes()
    if progress:
        progress(f"building CUDA kernels: {family} ({', '.join(archs)})")
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".fatbin.tmp")
    os.close(fd)
    try:
        compile_family(family, archs, ptx, Path(tmp), threads=threads)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path.read_bytes()


def fatbin_contents(data: bytes) -> list[tuple[str, int]]:
    """[("elf"|"ptx", sm number)] per entry of a fatbin (the documented-by-use header layout)."""
    import struct

    magic, _, header, size = struct.unpack_from("<IHHQ", data, 0)
    if magic != 0xBA55ED50:
        raise DeviceError("not a fatbin")
    entries, off = [], header
    while off < header + size:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, off)
        sm = struct.unpack_from("<I", data, off + 28)[0]
        entries.append(({1: "ptx", 2: "elf"}.get(kind, str(kind)), sm))
        off += entry_header + payload
    return entries


def build_all(archs: Sequence[str] | None = None, progress: Progress = None, cache_dir: Path | None = None,
              jobs: int | None = None) -> dict[str, bytes | DeviceError]:
    """Build every family in parallel (one nvcc process each). Failures are returned, not raised."""
    families = kernel_families()
    jobs = jobs or max(1, min(len(families), os.cpu_count() or 1))
    # Each nvcc call also compiles its archs on `jobs` threads: with one call per family the
    # longest families (matvec.cu, attention.cu) otherwise ran on one core at the end (CI's
    # two-core kernel-build test: 5:52 -> 4:28).

    def one(family: str) -> bytes | DeviceError:
        try:
            return build_fatbin(family, archs, progress, cache_dir, threads=jobs)
        except DeviceError as err:
            return err

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(zip(families, pool.map(one, families)))


# ---- kernel signatures for the registry ------------------------------------------------------
#
# Every entry point is `extern "C" __global__ void name(args)` written out in a .cu file, or, for
# entry points a macro generates, a comment line `// memra-kernel: name(PPii)` giving the
# struct-format signature directly (P pointer, i int32, I uint32, f float, q int64, Q uint64).

_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+' + _BOUNDS + r"void\s+" + _BOUNDS + r"(\w+)\s*\(([^)]*)\)", re.S)
_ANNOTATED = re.compile(r"//\s*memra-kernel:\s*(\w+)\s*\(([A-Za-z]*)\)")
_SCALAR_CODES = {
    "int": "i", "int32_t": "i", "unsigned": "I", "unsigned int": "I", "uint32_t": "I",
    "float": "f", "int64_t": "q", "long long": "q", "uint64_t": "Q", "unsigned long long": "Q",
}


def _arg_code(arg: str) -> str:
    arg = re.sub(r"\b(const|__restrict__|__grid_constant__)\b", " ", arg)
    if "*" in arg:
        return "P"
    words = arg.split()
    ctype = " ".join(words[:-1])
    if ctype not in _SCALAR_CODES:
        raise DeviceError(f"kernel argument type {ctype!r} has no registry code; use a pointer or int/float")
    return _SCALAR_CODES[ctype]


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define(?:[^\n]*\\\n)*[^\n]*", re.M)


def parse_signatures(text: str) -> dict[str, str]:
    sigs = {}
    for name, args in _ENTRY.findall(_DEFINE.sub("", text)):
        args = re.sub(r"//[^\n]*", "", args).strip()
        sigs[name] = "".join(_arg_code(a) for a in args.split(",")) if args else ""
    for name, codes in _ANNOTATED.findall(text):
        sigs[name] = codes
    return sigs


def kernel_signatures(families: Iterable[str] | None = None) -> dict[str, tuple[str, str]]:
    """name -> (family, struct-format signature) over the given families (default all)."""
    out: dict[str, tuple[str, str]] = {}
    for family in families or kernel_families():
        for name, sig in parse_signatures((source_dir() / f"{family}.cu").read_text()).items():
            out[name] = (family, sig)
    return out


def main() -> None:
    """`python -m memra_engine.gpu.build [archs...]`: build every family, print a line each."""
    import sys

    archs = tuple(sys.argv[1:]) or None
    failed = False
    for family, result in build_all(archs, progress=print).items():
        if isinstance(result, DeviceError):
            failed = True
            print(f"FAIL {family}: {result}")
        else:
            print(f"ok   {family}: {len(result)} bytes")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
