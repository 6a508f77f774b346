#!/usr/bin/env bash
# Every GPU check of the project in one command, for a lent GPU and a few minutes on it (each step under its own
# time limit and all under DEADLINE_S, default 450: a step that cannot finish before it is skipped; a step
# that fails or runs out leaves the others running). Prepare on a machine without a GPU with
# bench/gpu_prepare.sh (kernels compiled into .gpucache, packed into .gpucarry/gpucache.tar.xz), then carry
# .gpucarry.
#
# On the GPU machine, from the checkout with .gpucarry (or .gpucache) in it: bash bench/gpu_session.sh OUT_DIR
# (HW=h100 where the kernels were prepared for h100; default h200).
# STEPS picks steps. Default: ceilings quick ablate large sanitizer models (what QUICK=1 prepares; OUT_DIR
# gets env.txt, log.txt, sanitizer.txt and the JSON of each step). Also selectable (QUICK=0 prepares them):
# scaled paper fidelity dynamic. A .gpucarry/gpu-roller119.json from an earlier
# session's paper step is resumed (its ops are kept, the others run); PAPER_OPS=M1,M2 runs those ops alone.
set -u
out=${1:?usage: bench/gpu_session.sh OUT_DIR}
mkdir -p "$out"
[ -d .gpucache ] || tar xJf .gpucarry/gpucache.tar.xz
export ROLLER_CACHE_DIR=$PWD/.gpucache/roller PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
py=${PYTHON:-python3}
hw=${HW:-h200}
log=$out/log.txt
steps=${STEPS:-ceilings quick ablate large sanitizer models}
deadline=${DEADLINE_S:-450}
step() {  # step SECONDS NAME COMMAND...: one check, its time and exit status in the log
    local limit=$1 name=$2; shift 2
    case " $steps " in *" ${name%% *} "*) ;; *) return ;; esac
    if (( SECONDS + limit > deadline )); then
        echo "== $name: skipped, ${limit}s would pass DEADLINE_S=$deadline at ${SECONDS}s" >>"$log"
        return
    fi
    local t0=$SECONDS
    echo "== $name (limit ${limit}s)" >>"$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0))s" >>"$log"
}
{
    nvidia-smi; nvcc --version; $py --version
    $py -c "import cupy, numpy, scipy, onnx, onnxruntime, torch; print('cupy', cupy.__version__, 'numpy',
numpy.__version__, 'scipy', scipy.__version__, 'onnx', onnx.__version__, 'onnxruntime', onnxruntime.__version__,
'torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
    $py -c "from roller.backends.cuda import toolchain as t; print('roller sees:', t.gpu_present(), t.version_text())"
    ls "$ROLLER_CACHE_DIR/results/cuda" | wc -l
} >"$out/env.txt" 2>&1
if [ -f .gpucarry/toolchain.txt ] && ! diff -q <(nvcc --version | tail -2) .gpucarry/toolchain.txt >/dev/null; then
    # every kernel would compile again, on the GPU's time, and the timings would be a compile benchmark
    echo "== nvcc here differs from .gpucarry/toolchain.txt: no timing step runs" | tee -a "$log" "$out/env.txt"
    steps=""
fi
quick=(--suite roller119 --fp16 --top-k 4 --max-gflop 20)
large=(--suite large --top-k 3 --max-gflop 1200)
step 40 "ceilings" $py bench/gpu_ceilings.py --json "$out/ceilings.json"
step 110 "quick" $py bench/gpu.py --hw "$hw" "${quick[@]}" --ops quick --deadline 95 --json "$out/gpu-quick.json"
for desc in ${ABLATE:-bench/hw/*.yaml}; do  # each a description variant with one feature off: the A/B
    [ -f "$desc" ] || continue
    name=$(basename "$desc" .yaml)
    ops=$(cat ".gpucarry/ablate-$name.ops" 2>/dev/null || echo quick)  # those it changes (gpu_prepare.sh)
    [ -n "$ops" ] || { echo "== ablate $name: no op differs" >>"$log"; continue; }
    step 40 "ablate $name" $py bench/gpu.py --hw "$desc" "${quick[@]}" --ops "$ops" --deadline 30 \
        --json "$out/ablate-$name.json"
done
step 60 "large" $py bench/gpu.py --hw "$hw" "${large[@]}" --json "$out/gpu-large.json"
sanitize() {  # sanitize TOOL LIMIT: the sample under compute-sanitizer, its report appended to sanitizer.txt
    step "$2" "sanitizer $1" compute-sanitizer --tool "$1" --log-file "$out/$1.tmp" \
        $py bench/gpu_checks.py sample --hw "$hw" --suite "${SAMPLE_SUITE:-sanitize}"
    cat "$out/$1.tmp" >>"$out/sanitizer.txt" 2>/dev/null; rm -f "$out/$1.tmp"
}
sanitize memcheck 35
sanitize racecheck 40
step 55 "models" $py bench/gpu_checks.py models --hw "$hw" --skeletons .gpucache/skel --json "$out/models.json"
sanitize synccheck 25
step 45 "scaled" $py bench/gpu.py --hw "$hw" --suite scaled --fp16 --deadline 35 --json "$out/gpu-scaled.json"
resume=(); [ -f .gpucarry/gpu-roller119.json ] && resume=(--resume .gpucarry/gpu-roller119.json)
[ -n "${PAPER_OPS:-}" ] && resume+=(--ops "$PAPER_OPS")
step "${PAPER_S:-170}" "paper" $py bench/gpu.py --hw "$hw" --suite roller119 --fp16 --max-gflop 20 \
    --deadline $(( ${PAPER_S:-170} - 30 )) "${resume[@]}" --json "$out/gpu-roller119.json"
step 60 "fidelity" $py bench/fidelity.py --hw "$hw" --backend cuda --json "$out/fidelity.json"
step 50 "dynamic" $py bench/gpu_checks.py dynamic --hw "$hw" --json "$out/dynamic.json"
$py bench/gpu_summary.py "$out" | tee -a "$log"
