#!/usr/bin/env bash
# Here, without a GPU: everything bench/gpu_session.sh will run on a lent GPU, compiled ahead and packed into
# .gpucarry/gpucache.tar.xz, the one folder to name in the device tool's `carry`, with the nvcc version it was
# compiled by (.gpucarry/toolchain.txt: the session refuses to time with another, which would recompile for
# minutes). QUICK=1 (the default) compiles what the default session steps run (the quick, large, ablation and
# sanitizer sets at top-4: a few hundred cubins, minutes on two cores); QUICK=0 the whole paper suite at top-10
# and the zoo models (15-25 minutes; needs the zoo models: python -m bench.zoo, with torch). A later run
# recompiles only what changed. ABLATE lists the descriptions of the ablation (default: those in bench/hw/).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
export ROLLER_CACHE_DIR=$PWD/.gpucache/roller
hw=${HW:-h200}
if [ "${QUICK:-1}" = 1 ]; then
    mkdir -p .gpucarry
    rm -f .gpucarry/sass.json   # every kernel's SASS features, and the gate: a lost pipeline or vector fails here
    sass=(--sass .gpucarry/sass.json)
    $py bench/gpu.py --precompile --hw "$hw" --suite roller119 --fp16 --ops quick --top-k 4 --max-gflop 20 "${sass[@]}"
    $py bench/gpu.py --precompile --hw "$hw" --suite large --top-k 3 --max-gflop 1200 "${sass[@]}"
    for desc in ${ABLATE:-bench/hw/*.yaml}; do
        [ -f "$desc" ] || continue
        # the session times only the ops whose kernels the variant changes
        ops=$($py bench/gpu.py --hw "$desc" --suite roller119 --fp16 --ops quick --top-k 4 --max-gflop 20 \
            --differing-ops "$hw")
        echo "$ops" >".gpucarry/ablate-$(basename "$desc" .yaml).ops"
        [ -z "$ops" ] || $py bench/gpu.py --precompile --hw "$desc" --suite roller119 --fp16 --ops "$ops" --top-k 4 \
            --max-gflop 20 "${sass[@]}"
        $py bench/gpu.py --precompile --hw "$desc" --suite large --top-k 3 --max-gflop 1200 "${sass[@]}"
    done
    $py bench/gpu.py --precompile --hw "$hw" --suite sanitize --top-k 3 "${sass[@]}"
    $py bench/gpu_checks.py skeletons --out .gpucache/skel
    $py bench/gpu_checks.py precompile --hw "$hw" --skeletons .gpucache/skel
else
    $py bench/gpu.py --precompile --hw "$hw" --suite scaled --fp16
    $py bench/gpu.py --precompile --hw "$hw" --suite roller119 --fp16 --max-gflop 20
    $py bench/gpu_checks.py skeletons --out .gpucache/skel
    $py bench/gpu_checks.py precompile --hw "$hw" --skeletons .gpucache/skel
fi
mkdir -p .gpucarry
nvcc --version | tail -2 >.gpucarry/toolchain.txt
tar cJf .gpucarry/gpucache.tar.xz.part .gpucache && mv .gpucarry/gpucache.tar.xz.part .gpucarry/gpucache.tar.xz
echo "bench/gpu_prepare.sh: $(du -h .gpucarry/gpucache.tar.xz | cut -f1) in .gpucarry (name .gpucarry in the device tool's carry)"
