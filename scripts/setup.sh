#!/usr/bin/env bash
# Installs what relaymoe needs from Debian's packages (Debian 12), only the
# ones missing: idempotent. Runs apt-get as root, or through sudo.
#   scripts/setup.sh            the build, the tests (the Python ones too:
#                               mpi4py, pytest, venv, and hatchling, which
#                               pip needs to install the package offline) and
#                               the plots
#   scripts/setup.sh --hf       also what the tests of relaymoe.autograd and
#                               relaymoe.hf need (scripts/test.sh asks for it):
#                               Debian's PyTorch (python3-torch, 1.13) and, from
#                               PyPI into Debian's python3, Hugging Face
#                               transformers with its dependencies at the
#                               versions pinned in tests/python/requirements-hf.txt
#                               (4.47.1, which runs with PyTorch 1.13). Without
#                               PyPI it says so and goes on: the python_hf_*
#                               tests then skip.
#   RMOE_SETUP_EXTRA="pkg ..."  more packages (e.g. valgrind, clang for fuzzing)
#   RMOE_SETUP_PYPI=0           with --hf, nothing from PyPI (an offline machine)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
hf=0
[ "${1:-}" = --hf ] && hf=1

packages=(
  build-essential cmake pkg-config git
  libstarpu-dev libstarpumpi-1.3-3 starpu-tools
  openmpi-bin libopenmpi-dev
  libhwloc-dev hwloc-nox
  libopenblas-dev
  libcmocka-dev
  python3 python3-numpy python3-matplotlib
  python3-mpi4py python3-pytest python3-venv python3-hatchling
)
[ $hf = 0 ] || packages+=(python3-torch python3-pip)
# shellcheck disable=SC2206
packages+=(${RMOE_SETUP_EXTRA:-})

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# The pinned PyPI packages, each at its version (names as pip spells them).
requirements=$here/tests/python/requirements-hf.txt
pinned() {
  /usr/bin/python3 - "$requirements" <<'EOF'
import importlib.metadata as md
import sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        try:
            if md.version(name) != version:
                sys.exit(1)
        except md.PackageNotFoundError:
            sys.exit(1)
EOF
}
pypi=0
[ $hf = 0 ] || [ "${RMOE_SETUP_PYPI:-1}" = 0 ] || pinned 2>/dev/null || pypi=1

if [ ${#missing[@]} -eq 0 ] && [ $pypi = 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "setup: missing packages (${missing[*]}${missing[*]:+; }$([ $pypi = 0 ] || echo "transformers from PyPI")) and" \
       "neither root nor sudo to install them" >&2
  exit 1
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ $pypi = 1 ]; then
  # Into Debian's python3 (PEP 668 asks for --break-system-packages), where
  # the tests' virtual environment sees it beside Debian's torch. Every
  # dependency pinned too, so that a new release of one cannot break the
  # import; the rest (numpy, packaging, pyyaml, requests) are Debian's.
  echo "setup: installing from PyPI: $(grep -v '^#' "$requirements" | tr '\n' ' ')"
  if ! "${sudo[@]}" /usr/bin/python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
         --break-system-packages -r "$requirements"; then
    echo "setup: transformers could not be installed from PyPI: the python_hf_* tests will be skipped" >&2
  fi
fi
echo "setup: done"
