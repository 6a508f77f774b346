#!/usr/bin/env bash
# Here, without a GPU: everything bench/gpu_session.sh will run on a lent GPU, compiled ahead (15-25 minutes on
# two cores; a later run recompiles only what changed) and packed into .gpucarry/gpucache.tar.xz, the one
# folder to name in the device tool's `carry`. Needs nvcc and the zoo models (python -m bench.zoo, with torch).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
export ROLLER_CACHE_DIR=$PWD/.gpucache/roller
hw=${HW:-h200}
$py bench/gpu.py --precompile --hw "$hw" --suite scaled --fp16
$py bench/gpu.py --precompile --hw "$hw" --suite roller119 --fp16 --max-gflop 20
$py bench/gpu_checks.py skeletons --out .gpucache/skel
$py bench/gpu_checks.py precompile --hw "$hw" --skeletons .gpucache/skel
mkdir -p .gpucarry
tar cJf .gpucarry/gpucache.tar.xz.part .gpucache && mv .gpucarry/gpucache.tar.xz.part .gpucarry/gpucache.tar.xz
echo "bench/gpu_prepare.sh: $(du -h .gpucarry/gpucache.tar.xz | cut -f1) in .gpucarry (add .gpucache/ and .gpucarry/ to .git/info/exclude)"
