#!/bin/bash
# Paired A/B of two lockstep binaries on the text codec: $A and $B (default /tmp/lockstep-main
# and /tmp/lockstep-new), alternating, `text compress $FLAGS` (verify included) then
# `text decompress`, each output compared with the input. Usage: scripts/ab_text.sh FILE ROUNDS
# (e.g. FLAGS=--no-mix for version 1). Prints wall and user seconds per run
# (docs/BENCHMARKS.md, text codec sections).
f=$1; rounds=$2
A=${A:-/tmp/lockstep-main}; B=${B:-/tmp/lockstep-new}
# A directory of its own: concurrent runs with fixed /tmp names replace each other's files.
t=$(mktemp -d /tmp/ab.XXXXXX); trap 'rm -rf "$t"' EXIT
for r in $(seq 1 $rounds); do
  for b in main new; do
    bin=$A; [ $b = new ] && bin=$B
    s=$( { /usr/bin/time -f "%e %U" $bin text compress $FLAGS -q -f -c $f > $t/$b.lst; } 2>&1 )
    d=$( { /usr/bin/time -f "%e %U" $bin text decompress -q -f -c $t/$b.lst > $t/$b.out; } 2>&1 )
    cmp -s $t/$b.out $f || echo "ROUNDTRIP FAIL $b"
    echo "round $r $b size $(stat -c %s $t/$b.lst) compress $s decompress $d load $(cut -d' ' -f1 /proc/loadavg)"
  done
  cmp -s $t/main.lst $t/new.lst && echo "round $r same bytes" || echo "round $r bytes differ"
done
