#!/bin/bash
# Paired A/B of two lockstep binaries on the text codec: $A and $B (default /tmp/lockstep-main
# and /tmp/lockstep-new), alternating, `text compress $FLAGS` (verify included) then
# `text decompress`, each output compared with the input. Usage: scripts/ab_text.sh FILE ROUNDS
# (e.g. FLAGS=--no-mix for version 1). Prints wall and user seconds per run
# (docs/BENCHMARKS.md, text codec sections).
f=$1; rounds=$2
A=${A:-/tmp/lockstep-main}; B=${B:-/tmp/lockstep-new}
for r in $(seq 1 $rounds); do
  for b in main new; do
    bin=$A; [ $b = new ] && bin=$B
    s=$( { /usr/bin/time -f "%e %U" $bin text compress $FLAGS -q -f -c $f > /tmp/ab.$b.lst; } 2>&1 )
    d=$( { /usr/bin/time -f "%e %U" $bin text decompress -q -f -c /tmp/ab.$b.lst > /tmp/ab.$b.out; } 2>&1 )
    cmp -s /tmp/ab.$b.out $f || echo "ROUNDTRIP FAIL $b"
    echo "round $r $b size $(stat -c %s /tmp/ab.$b.lst) compress $s decompress $d load $(cut -d' ' -f1 /proc/loadavg)"
  done
  cmp -s /tmp/ab.main.lst /tmp/ab.new.lst && echo "round $r same bytes" || echo "round $r bytes differ"
done
