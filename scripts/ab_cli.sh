#!/usr/bin/env bash
# Paired A/B of two lockstep binaries, alternating within each round, one thread: delta
# encode/decode of the bf16 600 -> 800 pair and text compress/decompress of a fixed 6,000-byte
# text (version 1 on both sides: NEW_TEXT_FLAGS=--no-mix for a binary that writes version 2
# by default). Prints "round side what seconds" lines and checks that both sides wrote the
# same bytes. Used for issue 13's before/after (docs/BENCHMARKS.md).
#
#   scripts/ab_cli.sh OLD_BINARY NEW_BINARY TEXT_FILE   (ROUNDS=3, DATA=../shared/data)
set -euo pipefail
OLD=$1
NEW=$2
TEXT=$3
ROUNDS=${ROUNDS:-3}
D=${DATA:-../shared/data}/trajectory-gpt2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
head -c 6000 "$TEXT" >"$T/text.txt"
export RAYON_NUM_THREADS=1
timed() { # what, command...
    local what=$1 s e
    shift
    s=$(date +%s.%N)
    "$@"
    e=$(date +%s.%N)
    echo "$r $side $what $(echo "$e - $s" | bc)"
}
for r in $(seq 1 "$ROUNDS"); do
    for side in old new; do
        B=$OLD
        EXTRA=()
        if [ $side = new ]; then
            B=$NEW
            read -r -a EXTRA <<<"${NEW_TEXT_FLAGS:-}"
        fi
        timed delta-encode "$B" -q delta encode -f --backend cpu \
            --reference "$D/gpt2_step000600_bf16.safetensors" \
            --target "$D/gpt2_step000800_bf16.safetensors" -o "$T/$side.lsd"
        timed delta-decode "$B" -q delta decode -f --backend cpu \
            --reference "$D/gpt2_step000600_bf16.safetensors" "$T/$side.lsd" \
            -o "$T/$side.safetensors"
        timed text-compress "$B" -q text compress -f "$T/text.txt" -o "$T/$side.lst" "${EXTRA[@]}"
        timed text-decompress "$B" -q text decompress -f "$T/$side.lst" -o "$T/$side.txt"
        cmp "$T/text.txt" "$T/$side.txt"
    done
    cmp "$T/old.lsd" "$T/new.lsd" && cmp "$T/old.lst" "$T/new.lst" && echo "$r same bytes"
done
