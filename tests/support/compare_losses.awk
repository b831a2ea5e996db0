# Two loss logs ("step <i> loss <x>" per line, as the examples' --log_file writes them): every step of
# the second (LOG) must be in the first (REFERENCE) within a relative tolerance, and with all=1 the two
# must have the same steps. Prints one summary line; exits 1 on a difference.
#   awk -v rtol=2e-4 -v label="..." [-v all=1] -f compare_losses.awk REFERENCE LOG
NR == FNR { ref[$2] = $4; n++; next }
{ got++; if (!($2 in ref)) { print label ": step " $2 " not in the reference"; bad = 1; next }
  d = $4 - ref[$2]; if (d < 0) d = -d; r = ref[$2] < 0 ? -ref[$2] : ref[$2];
  if (d > rtol * r) { printf "%s: step %d loss %.9g vs reference %.9g (rel %.2e > %s)\n", label, $2, $4, ref[$2], d / r, rtol; bad = 1 }
  if (d / r > worst) worst = d / r }
END { if (all && got != n) { print label ": " got " steps, reference has " n; bad = 1 }
      printf "%s: %d steps, worst relative difference %.2e (tolerance %s)\n", label, got, worst, rtol; exit bad }
