#!/usr/bin/env bash
# Run fuzz targets one after another, each for SECONDS (default 600), niced, one process at a
# time. libFuzzer runs in fork mode (one child at a time) with crashes, timeouts and OOMs
# ignored, so a target keeps fuzzing for its whole time after a first finding; every finding
# is still written to fuzz/artifacts/<target>/. Logs go to fuzz/logs/<target>.log.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
# With FUZZ_END=HH:MM (UTC), each target instead gets an equal share of the time left until
# then, at most SECONDS (used when the session's deadline is shorter than 8 x SECONDS).
set -u
cd "$(dirname "$0")/.."
secs=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(blob_decode lsd_read archive_read text_decode model_load rans_decode range_decode safetensors_input)
fi
mkdir -p fuzz/logs
left=${#targets[@]}
for t in "${targets[@]}"; do
    run=$secs
    if [ -n "${FUZZ_END:-}" ]; then
        share=$(( ($(date -u -d "$FUZZ_END" +%s) - $(date -u +%s)) / left - 15 ))
        [ "$share" -lt "$run" ] && run=$share
    fi
    left=$((left - 1))
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    echo "== $t: $(date -u +%H:%M:%S) for ${run}s"
    nice -n 10 cargo +nightly fuzz run -a "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$run" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
        -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        > "fuzz/logs/$t.log" 2>&1
    echo "== $t: exit $?, $(date -u +%H:%M:%S), corpus $(ls "fuzz/corpus/$t" | wc -l) files," \
        "artifacts: $(ls "fuzz/artifacts/$t" | tr '\n' ' ')"
    grep -E '^#[0-9]+: ' "fuzz/logs/$t.log" | tail -1
done
