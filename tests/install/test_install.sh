#!/usr/bin/env bash
# Installs relaymoe into a scratch prefix, builds examples/embed against the
# installed CMake package (and once more through pkg-config), and runs it
# under mpiexec on 2 ranks.
#   test_install.sh SOURCE_DIR BUILD_DIR MPIEXEC
set -euo pipefail
src=$1 build=$2 mpiexec=$3
prefix=$build/install-test/prefix
work=$build/install-test/embed
rm -rf "$build/install-test"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$src/examples/embed" -B "$work" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work" >/dev/null
test -f "$prefix/lib/pkgconfig/relaymoe.pc" || test -f "$prefix"/lib/*/pkgconfig/relaymoe.pc
pcdir=$(dirname "$(find "$prefix" -name relaymoe.pc | head -1)")
PKG_CONFIG_PATH=$pcdir mpicc -o "$work/embed-pc" "$src/examples/embed/embed.c" \
  $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs relaymoe) -lm
libdir=$(dirname "$(find "$prefix" -name 'librelaymoe.so' | head -1)")
for exe in "$work/embed" "$work/embed-pc"; do
  LD_LIBRARY_PATH=$libdir:${LD_LIBRARY_PATH:-} "$mpiexec" -n 2 --oversubscribe "$exe"
done
