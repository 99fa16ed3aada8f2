#!/usr/bin/env bash
# Whole-archive numbers on ../shared/data/trajectory-gpt2: lockstep archives (default K, and
# K=1 = anchor codec only) against zstd -19 of each file and the ZipNN-style estimate.
# Usage: scripts/archive_bench.sh [DATA_DIR]   (builds the release binary first)
set -euo pipefail
D=${1:-$(dirname "$0")/../../shared/data/trajectory-gpt2}
cargo build --release --quiet --bin lockstep --example anchor_vs_zipnn
L=target/release/lockstep
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
run() { # name files...
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N); $L pack "$@" -o "$T/$name.lstp" --json > "$T/$name.json"; t1=$(date +%s.%N)
  $L pack "$@" -o "$T/$name-k1.lstp" -k 1 --json > /dev/null
  local last; last=$($L list "$T/$name.lstp" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["checkpoints"][-1]["step"])')
  local e0 e1
  e0=$(date +%s.%N); $L extract "$T/$name.lstp" --step "$last" -o "$T/x.safetensors" --force > /dev/null; e1=$(date +%s.%N)
  local v0 v1
  v0=$(date +%s.%N); $L verify "$T/$name.lstp" > /dev/null; v1=$(date +%s.%N)
  local input=0 z=0
  for f in "$@"; do input=$((input + $(stat -c %s "$f"))); z=$((z + $(zstd -19 -T1 -c "$f" | wc -c))); done
  local lsz k1; lsz=$(stat -c %s "$T/$name.lstp"); k1=$(stat -c %s "$T/$name-k1.lstp")
  local noanchor; noanchor=$($L stats "$T/$name.lstp" --json | python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["ratio_without_anchor"])')
  python3 - "$name" "$input" "$lsz" "$k1" "$z" "$noanchor" "$t0" "$t1" "$e0" "$e1" "$v0" "$v1" "$($L list "$T/$name.lstp" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["checkpoints"][-1]["input_bytes"])')" <<'PY'
import sys
n, inp, lsz, k1, z, na, t0, t1, e0, e1, v0, v1, last = sys.argv[1:]
inp, lsz, k1, z, last = map(int, (inp, lsz, k1, z, last))
print(f"{n}: input {inp} B; archive {lsz} B ({lsz/inp:.4f}), without the anchor {na}; "
      f"all-anchor (K=1) {k1} B ({k1/inp:.4f}); zstd -19 per file {z} B ({z/inp:.4f}); "
      f"pack {inp/(float(t1)-float(t0))/1e6:.1f} MB/s, extract last step {last/(float(e1)-float(e0))/1e6:.1f} MB/s, "
      f"verify {inp/(float(v1)-float(v0))/1e6:.1f} MB/s (wall clock, whole CLI)")
PY
}
run bf16 "$D"/gpt2_step000{200,400,600,800}_bf16.safetensors
run fp32 "$D"/gpt2_step000{600,800}_fp32.safetensors
target/release/examples/anchor_vs_zipnn "$D"/gpt2_step000{200,400,600,800}_bf16.safetensors "$D"/gpt2_step000{600,800}_fp32.safetensors
