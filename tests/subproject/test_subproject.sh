#!/usr/bin/env bash
# Configures and builds tests/subproject, a project that takes relaymoe in
# (HOW: add_subdirectory or FetchContent) with relaymoe's defaults and
# CMocka hidden from pkg-config, checks that relaymoe wrote nothing into the
# including project's own build folder, and runs its program (the embedding
# example: ring against all-to-all, forward and backward) on 2 ranks.
#   test_subproject.sh SOURCE_DIR WORK MPIEXEC HOW [cmake options...]
set -euo pipefail
src=$1 work=$2 mpiexec=$3 how=$4
shift 4
rm -rf "${work:?}"
mkdir -p "$work/pkgconfig"

# pkg-config's own folders and PKG_CONFIG_PATH's, without cmocka.pc.
IFS=: read -ra dirs <<< "${PKG_CONFIG_PATH:-}:$(pkg-config --variable pc_path pkg-config)"
for dir in "${dirs[@]}"; do
  for pc in "$dir"/*.pc; do
    [ -e "$pc" ] || continue
    name=${pc##*/}
    [ "$name" = cmocka.pc ] || [ -e "$work/pkgconfig/$name" ] || ln -s "$pc" "$work/pkgconfig/$name"
  done
done
export PKG_CONFIG_LIBDIR=$work/pkgconfig PKG_CONFIG_PATH=
if pkg-config --exists cmocka; then
  echo "subproject: CMocka is still visible to pkg-config" >&2
  exit 1
fi

log=$work/build.log
if ! { cmake -S "$src/tests/subproject" -B "$work/build" -DRELAYMOE_SOURCE_DIR="$src" -DRELAYMOE_VIA="$how" "$@" &&
       cmake --build "$work/build" -j"$(nproc)"; } > "$log" 2>&1; then
  cat "$log"
  echo "subproject: configuring or building the project that takes relaymoe in by $how failed" >&2
  exit 1
fi
grep "relaymoe .* taken in by" "$log"

# relaymoe's generated files belong to its own build folder.
for f in generated RelayMoEConfig.cmake relaymoe.pc; do
  if [ -e "$work/build/$f" ]; then
    echo "subproject: relaymoe wrote $f into the including project's build folder" >&2
    exit 1
  fi
done

"$mpiexec" -n 2 --oversubscribe "$work/build/embed"
