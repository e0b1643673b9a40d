#!/usr/bin/env bash
# Installs what relaymoe needs from Debian's packages (Debian 12), only the
# ones missing: idempotent. Runs apt-get as root, or through sudo.
#   scripts/setup.sh            the build, the tests (the Python ones too:
#                               mpi4py, pytest, venv, and wheel, which pip
#                               needs to install the package offline) and
#                               the plots
#   RMOE_SETUP_EXTRA="pkg ..."  more packages (e.g. python3-torch for the
#                               PyTorch examples, valgrind, clang for fuzzing)
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libstarpu-dev libstarpumpi-1.3-3 starpu-tools
  openmpi-bin libopenmpi-dev
  libhwloc-dev hwloc-nox
  libopenblas-dev
  libcmocka-dev
  python3 python3-numpy python3-matplotlib
  python3-mpi4py python3-pytest python3-venv python3-wheel
)
# shellcheck disable=SC2206
packages+=(${RMOE_SETUP_EXTRA:-})

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "setup: missing packages (${missing[*]}) and neither root nor sudo to install them" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
