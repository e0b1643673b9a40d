# Sourced: rmoe_norand fills the array rmoe_norand with the command prefix
# that runs a program without address randomisation (`setarch ARCH -R`), or
# leaves it empty where the kernel or the container refuses it.
# A simulation repeats itself only at the same addresses: StarPU walks some
# of its hash tables (keyed by handle and request pointers) in address order,
# so with randomisation two runs of one case can differ by a few
# microseconds (8 ranks) to 0.1% (all-to-all at EP 32).
rmoe_norand() {
  rmoe_norand=()
  if setarch "$(uname -m)" -R true 2>/dev/null; then
    rmoe_norand=(setarch "$(uname -m)" -R)
  fi
}
