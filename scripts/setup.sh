#!/usr/bin/env bash
# Set up Roller in this clone: system packages, a virtual environment in .venv, and the package itself.
#
#   bash scripts/setup.sh          # runtime: roller + pyopencl (OpenCL kernels run on the CPU through PoCL)
#   bash scripts/setup.sh --dev    # also the test, lint and plot extras
#
# Idempotent: packages already installed are not installed again, and an existing .venv is reused.
# Written for Debian 12 with Python 3.11, run as root (as CI does); it also works as another user when the
# system packages are already there. It exports nothing: the project sets HIP_PLATFORM=amd itself, only in the
# environment of the hipcc processes it starts.
set -euo pipefail

extras="opencl"
for arg in "$@"; do
    case "$arg" in
        --dev) extras="opencl,dev,plot" ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown option '$arg' (expected --dev)" >&2; exit 2 ;;
    esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

# 1. System packages: PoCL (OpenCL on the CPU), the OpenCL ICD loader and headers, clinfo, and hipcc.
system_packages=(pocl-opencl-icd ocl-icd-opencl-dev clinfo hipcc)
# --dev: headless Chromium, in which the tests render the `roller compare` HTML report.
if [[ "$extras" == *dev* ]]; then
    system_packages+=(chromium)
fi
missing=()
for pkg in "${system_packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]})); then
    if [[ "$(id -u)" != 0 ]]; then
        echo "setup.sh: missing system packages: ${missing[*]}; install them as root:" >&2
        echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
        exit 5
    fi
    echo "setup.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. Virtual environment (reused when it is already there and works).
if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c "import sys" 2>/dev/null; then
    rm -rf .venv
    python3 -m venv .venv
fi

# 3. The package, editable, with its extras.
# pip's stderr is passed on, less the machine-specific "Location 'file://...' is ignored" index warnings;
# pipefail keeps pip's exit status.
{ .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${extras}]" 2>&1 1>&3 \
    | { grep -v "^WARNING: Location 'file://.*' is ignored" || true; } >&2; } 3>&1

# 4. One line on what was set up.
echo "setup.sh: roller installed in $repo/.venv with extras [${extras}] ($(.venv/bin/python -V 2>&1));" \
     "run .venv/bin/roller"
