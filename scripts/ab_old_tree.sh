# Sourced by the same-call A/B scripts: installs the older tree in ab/old.tar (made with `git archive -o
# ab/old.tar REV pyproject.toml engine cuda memra_tui README.md assets`) into /tmp/site-old, with that
# tree's sm_90a fatbins from ab/prebuilt when there (built in a checkout of REV, engine/ copied to
# memra_engine/ and cuda/ to memra_engine/kernels/ on PYTHONPATH: `python3 scripts/build_prebuilt.py
# ab/prebuilt`; used if their key matches). Run it with the old tree first: PYTHONPATH=/tmp/site-old:/tmp/site.
rm -rf /tmp/old && mkdir /tmp/old && tar -xf ab/old.tar -C /tmp/old || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site-old \
  /tmp/old > "$OUT/ab-pip.log" 2>&1 || { tail -5 "$OUT/ab-pip.log"; exit 1; }
if [ -d ab/prebuilt ]; then
  mkdir -p /tmp/site-old/memra_engine/kernels/prebuilt && cp ab/prebuilt/* /tmp/site-old/memra_engine/kernels/prebuilt/
fi
