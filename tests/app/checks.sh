# Sourced by the end-to-end scripts of tests/app and tests/train (lib.sh
# among them): a fresh work folder and the helpers that count failed checks.
# Expects work set.
#   ok MSG / bad MSG  a passed or failed check (bad counts it in fails)
rm -rf "$work" && mkdir -p "$work"
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
