# Sourced by the fixtures of the Fortran and Python tests (tests/fortran,
# tests/python setup.sh) after setting fixture (its name) and work:
# fixture_unavailable REASON writes "unavailable: REASON" to WORK/status
# (the tests then report skipped) and ends the fixture; under
# RMOE_EMBED_REQUIRE=1 (CI) it fails instead.
fixture_unavailable() {
  echo "unavailable: $1" > "$work/status"
  [ "${RMOE_EMBED_REQUIRE:-0}" = 1 ] && { echo "$1 (RMOE_EMBED_REQUIRE=1)" >&2; exit 1; }
  echo "$fixture setup: $1"
  exit 0
}
