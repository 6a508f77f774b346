#!/usr/bin/env bash
# Set up Roller in this clone: system packages, a virtual environment in .venv, and the package itself.
#
#   bash scripts/setup.sh          # runtime: roller + pyopencl (OpenCL kernels run on the CPU through PoCL)
#   bash scripts/setup.sh --dev    # also the test, lint and plot extras
#   bash scripts/setup.sh --torch  # also PyTorch's CPU build and transformers: torch.compile(m, backend="roller")
#
# Idempotent: packages already installed are not installed again, and an existing .venv is reused.
# Written for Debian 12 with Python 3.11, run as root (as CI does); it also works as another user when the
# system packages are already there. It exports nothing: the project sets HIP_PLATFORM=amd itself, only in the
# environment of the hipcc processes it starts.
set -euo pipefail

extras="opencl"
torch=""
for arg in "$@"; do
    case "$arg" in
        --dev) extras="opencl,dev,plot" ;;
        --torch) torch=1 ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown option '$arg' (expected --dev or --torch)" >&2; exit 2 ;;
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
pip_quiet() {
    { .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1 1>&3 \
        | { grep -v "^WARNING: Location 'file://.*' is ignored" || true; } >&2; } 3>&1
}
pip_quiet -e ".[${extras}]"

# 4. --torch: the torch extra with torch's CPU build (PyPI's default wheel bundles CUDA: gigabytes), and
# transformers for the BERT case of the torch test tier. The CPU build is taken from a local wheel where pip
# finds one (this project's CI machines have it on disk), else from PyTorch's CPU index. Where neither works
# the rest of the setup stands and that tier is skipped, with the reason.
if [[ -n "$torch" ]]; then
    cpu_torch="torch==2.13.0+cpu"
    if { .venv/bin/python -c "import torch" 2>/dev/null || pip_quiet "$cpu_torch" 2>/dev/null ||
         pip_quiet "$cpu_torch" --extra-index-url https://download.pytorch.org/whl/cpu; } &&
       pip_quiet -e ".[${extras},torch]" transformers; then
        extras="${extras},torch"
    else
        echo "setup.sh: PyTorch could not be installed; the torch test tier will be skipped" >&2
    fi
fi

# 5. One line on what was set up.
echo "setup.sh: roller installed in $repo/.venv with extras [${extras}] ($(.venv/bin/python -V 2>&1));" \
     "run .venv/bin/roller"
