#!/usr/bin/env bash
# Every GPU check of the project in one command, for a lent GPU and a few minutes on it (each step under its own
# time limit; a step that fails or runs out leaves the others running). Prepare on a machine without a GPU with
# bench/gpu_prepare.sh (kernels compiled into .gpucache, packed into .gpucarry/gpucache.tar.xz), then carry
# .gpucarry.
#
# On the GPU machine, from the checkout with .gpucarry (or .gpucache) in it: bash bench/gpu_session.sh OUT_DIR
# (HW=h100 where the kernels were prepared for h100; default h200).
# OUT_DIR gets eight files: env.txt, log.txt, sanitizer.txt and the JSON of each step. STEPS (default: all of
# scaled paper models sanitizer fidelity dynamic) picks steps; a .gpucarry/gpu-roller119.json from an earlier
# session's paper step is resumed (its ops are kept, the others run); PAPER_OPS=M1,M2 runs those ops alone.
set -u
out=${1:?usage: bench/gpu_session.sh OUT_DIR}
mkdir -p "$out"
[ -d .gpucache ] || tar xJf .gpucarry/gpucache.tar.xz
export ROLLER_CACHE_DIR=$PWD/.gpucache/roller PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
py=${PYTHON:-python3}
hw=${HW:-h200}
log=$out/log.txt
steps=${STEPS:-scaled paper models sanitizer fidelity dynamic}
step() {  # step SECONDS NAME COMMAND...: one check, its time and exit status in the log
    local limit=$1 name=$2; shift 2
    case " $steps " in *" ${name%% *} "*) ;; *) return ;; esac
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
step 45 "scaled" $py bench/gpu.py --hw "$hw" --suite scaled --fp16 --deadline 35 --json "$out/gpu-scaled.json"
resume=(); [ -f .gpucarry/gpu-roller119.json ] && resume=(--resume .gpucarry/gpu-roller119.json)
[ -n "${PAPER_OPS:-}" ] && resume+=(--ops "$PAPER_OPS")
step "${PAPER_S:-170}" "paper" $py bench/gpu.py --hw "$hw" --suite roller119 --fp16 --max-gflop 20 \
    --deadline $(( ${PAPER_S:-170} - 30 )) "${resume[@]}" --json "$out/gpu-roller119.json"
step 60 "models" $py bench/gpu_checks.py models --hw "$hw" --skeletons .gpucache/skel --json "$out/models.json"
step 40 "sanitizer memcheck" compute-sanitizer --tool memcheck --log-file "$out/sanitizer.txt" $py bench/gpu_checks.py sample --hw "$hw"
step 40 "sanitizer racecheck" compute-sanitizer --tool racecheck --log-file "$out/racecheck.txt" \
    $py bench/gpu_checks.py sample --hw "$hw"
cat "$out/racecheck.txt" >>"$out/sanitizer.txt" 2>/dev/null; rm -f "$out/racecheck.txt"
step 60 "fidelity" $py bench/fidelity.py --hw "$hw" --backend cuda --json "$out/fidelity.json"
step 50 "dynamic" $py bench/gpu_checks.py dynamic --hw "$hw" --json "$out/dynamic.json"
