#!/bin/bash
# Paired rounds of the text codec's two versions and two binaries on FILE: each round runs
# version 1 (the new binary with --no-mix), version 2 on the baseline binary $A and version 2
# on the new binary $B (defaults /tmp/lockstep-main, /tmp/lockstep-new): `text compress`
# (verify included) then `text decompress`, each output compared with the input. Prints wall
# and user seconds per run. Usage: scripts/ab_text_v1v2.sh FILE ROUNDS (docs/BENCHMARKS.md,
# "strands").
f=$1; rounds=$2
# A directory of its own: several engineers run this at once on one machine, and fixed /tmp
# names let one run's files replace another's between its compress and decompress.
t=$(mktemp -d /tmp/ab3.XXXXXX); trap 'rm -rf "$t"' EXIT
A=${A:-/tmp/lockstep-main}; B=${B:-/tmp/lockstep-new}
for r in $(seq 1 $rounds); do
  for cfg in v1 base new; do
    bin=$B; fl=""
    [ $cfg = v1 ] && fl=--no-mix
    [ $cfg = base ] && bin=$A
    s=$( { /usr/bin/time -f "%e %U" $bin text compress $fl -q -f -c $f > $t/$cfg.lst; } 2>&1 )
    d=$( { /usr/bin/time -f "%e %U" $bin text decompress -q -f -c $t/$cfg.lst > $t/$cfg.out; } 2>&1 )
    cmp -s $t/$cfg.out $f || echo "ROUNDTRIP FAIL $cfg"
    echo "round $r $cfg size $(stat -c %s $t/$cfg.lst) compress $s decompress $d load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
