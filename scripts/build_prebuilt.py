"""Build every kernel family for sm_90a here (nvcc, ~2 minutes on 2 cores; the user cache makes a
rerun instant) into build/prebuilt as the loader takes prebuilt fatbins (build.write_prebuilt: each
`<family>.fatbin` with its `<family>.key`). Carried to the GPU machine (run's carry:
"build/prebuilt"), scripts/device_run.sh copies them into the installed package, so the device
builds nothing. Usage: python3 scripts/build_prebuilt.py [OUT_DIR]   (default build/prebuilt)"""
import sys
from pathlib import Path

from memra_engine.gpu import build


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/prebuilt")
    results = build.build_all(("sm_90a",), jobs=2)
    failed = {f: r for f, r in results.items() if isinstance(r, Exception)}
    for family, err in failed.items():
        print(f"FAIL {family}: {err}")
    if failed:
        raise SystemExit(1)
    build.write_prebuilt(out, results)
    print(f"{out}: {len(results)} families, source key {build.source_hash()}")


if __name__ == "__main__":
    main()
