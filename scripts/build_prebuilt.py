"""Build every kernel family for sm_90a here (nvcc, ~2 minutes on 2 cores) into build/prebuilt, each
`<family>.fatbin` with the `<family>.key` (cuda/'s source hash) that engine/gpu/build.py checks before
it takes a prebuilt fatbin. Carried to the GPU machine (run's carry: "build/prebuilt"),
scripts/device_run.sh copies them into the installed package, so the device builds nothing.
Usage: python3 scripts/build_prebuilt.py [OUT_DIR]   (default build/prebuilt)"""
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from memra_engine.gpu import build


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/prebuilt")
    out.mkdir(parents=True, exist_ok=True)
    key = build.source_hash()

    def one(family: str) -> str:
        build.compile_family(family, ("sm_90a",), False, out / f"{family}.fatbin")
        (out / f"{family}.key").write_text(key)
        return family

    with ThreadPoolExecutor(max_workers=2) as pool:
        for family in pool.map(one, build.kernel_families()):
            print(f"ok   {family}")
    print(f"{out}: source key {key}")


if __name__ == "__main__":
    main()
