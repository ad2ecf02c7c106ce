#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2329  # the stage_* functions are called through run_stage "stage_<name>"
# The GPU proof on one Hopper GPU (H200): build LMCache 0.5.6 (or --lmcache-version's) from its sdist with the serving
# image's recipe (docker/vllm-lmcache/build-lmcache.sh, timed), verify it (verify_lmcache.py), run LMCache's own kernel
# tests from the sdist, check its cuda_ops copy kernel against a PyTorch reference, run CUDA IPC into the real
# `lmcache server` across processes with KV tensors shaped like both models' cache groups and vLLM's align-mode block
# ids (store, lookup, retrieve, compare bytes; per-request phases and GB/s against chunks per request, beside a pinned
# cudaMemcpy), run N TP-rank processes sharing the GPU against the pod's server (and one server per rank), and run
# `glm53 probe startup` on the server's GPU-mode logs. The package benchmarks/gpu_proof/ (`$python benchmarks/gpu_proof
# COMMAND`) does the GPU work; this script installs, builds and sequences. Every stage runs even if an earlier
# independent one failed; the exit status is non-zero when any stage failed. docs/gpu-transfer.md holds the results of
# the transfer stages.
#
# Works offline (a lent GPU host reaches no package index): everything comes from a carry folder, which
# scripts/gpu-proof-carry.sh fills on a machine with the package index (no CUDA needed there):
#   CARRY/sdist/lmcache-V.tar.gz       the LMCache sdist, V from --lmcache-version (the build and lmcache-tests stages)
#   CARRY/wheels/*.whl                 docker/vllm-lmcache/build-requirements.txt and their dependencies (less rt/'s;
#                                      the build stage)
#   CARRY/rt/*.whl                     LMCache's runtime dependencies the host lacks (scripts/gpu-proof-rt.txt;
#                                      installed with --no-deps; also searched by the build)
# A run with --lmcache-wheel (a wheel an earlier run built, in its --out) needs rt/ and the wheel only:
# `scripts/gpu-proof-carry.sh --wheel WHL` fills such a folder, small enough to carry beside the working tree.
#
# Usage: scripts/gpu-proof.sh [--dry-run] [--carry DIR] [--out DIR] [--python PY] [--lmcache-version V]
#                             [--lmcache-wheel WHL] [--stages LIST] [--max-jobs N] [--case PROFILE@CHUNK[:COUNTS]]...
#                             [--chunks LIST]
#                             [--reps N] [--l1-size-gb G] [--all-real-at N] [--tp-case PROFILE@CHUNK]...
#                             [--ranks LIST] [--layouts LIST] [--tp-chunks N] [--tp-reps N] [--server-arg FLAG]...
#                             [--l2 TYPE] [--time-budget S]
#   --dry-run        check the inputs and print the plan; needs no GPU, compiler or LMCache (CI runs this)
#   --carry DIR      the carry folder (default .gpuproof)
#   --out DIR        results: summary.txt, kernels.json, ipc.json, tp.json, the wheel, lmcache-build.json,
#                    logs.tar.gz (default $OUT when set, else artifacts/gpu-proof)
#   --python PY      the interpreter whose environment holds the target torch (default python3)
#   --lmcache-version V  the LMCache release whose sdist is built and whose kernel tests run (default 0.5.6, the
#                    serving image's; a pre-release such as 0.5.7rc2 is proven the same way before the image moves)
#   --lmcache-wheel  install this LMCache wheel instead of building (skips the build stage)
#   --stages LIST    comma-separated subset of: machine,build,deps,install,kernels,ipc,tp,probe,lmcache-tests
#                    (default all, in this order: the build and its verification run before LMCache's runtime
#                    dependencies are installed, as in the image's build stage; LMCache's own kernel tests run last,
#                    in the time left)
#   --time-budget S  seconds the whole run may take (default 560: a lent GPU host's commands end at 10 minutes)
#   --max-jobs N     parallel compile jobs (default: all cores)
#   --case/--chunks/--reps/--l1-size-gb/--all-real-at   passed to `benchmarks/gpu_proof ipc` (see its --help)
#   --tp-case/--ranks/--layouts/--tp-chunks/--tp-reps   passed to `benchmarks/gpu_proof tp`
#   --server-arg FLAG  a server flag beyond the chart's sidecar flags, for both (experiments: --max-gpu-workers=8)
#   --l2 TYPE        the servers' L2 tier, as the chart's lmcache.l2.type: fs (the default) or off, for both
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
prog="gpu-proof"
all_stages="machine,build,deps,install,kernels,ipc,tp,probe,lmcache-tests"

dry_run=0
carry=".gpuproof"
out="${OUT:-artifacts/gpu-proof}"
python="python3"
lmcache_version="0.5.6"
wheel=""
stages="$all_stages"
max_jobs="$(nproc)"
time_budget=560
bench_args=()
tp_args=()
server_args=()

fail() {
    echo "$prog: error: $*" >&2
    exit 2
}

usage() {
    sed -n '3,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

need_value() {
    if [ $# -lt 2 ] || [ -z "$2" ]; then
        fail "expected a value after $1; see --help."
    fi
}

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1; shift ;;
        --carry) need_value "$@"; carry="$2"; shift 2 ;;
        --out) need_value "$@"; out="$2"; shift 2 ;;
        --python) need_value "$@"; python="$2"; shift 2 ;;
        --lmcache-version) need_value "$@"; lmcache_version="$2"; shift 2 ;;
        --lmcache-wheel) need_value "$@"; wheel="$2"; shift 2 ;;
        --stages) need_value "$@"; stages="$2"; shift 2 ;;
        --max-jobs) need_value "$@"; max_jobs="$2"; shift 2 ;;
        --time-budget) need_value "$@"; time_budget="$2"; shift 2 ;;
        --case | --chunks | --reps | --l1-size-gb | --all-real-at) need_value "$@"; bench_args+=("$1" "$2"); shift 2 ;;
        --tp-case | --ranks | --layouts | --tp-chunks | --tp-reps) need_value "$@"; tp_args+=("$1" "$2"); shift 2 ;;
        --server-arg) need_value "$@"; server_args+=("--server-arg=$2"); shift 2 ;;
        --l2) need_value "$@"; server_args+=("--l2=$2"); shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) fail "unknown argument '$1'; see --help." ;;
    esac
done

# ---- preflight: every input checked before anything runs -------------------------------------------------------
IFS=',' read -r -a stage_list <<<"$stages"
for stage in "${stage_list[@]}"; do
    [[ ",$all_stages," == *",$stage,"* ]] || fail "unknown stage '$stage'; expected some of $all_stages."
done
wants() { [[ ",$stages," == *",$1,"* ]]; }
[[ "$max_jobs" =~ ^[1-9][0-9]*$ ]] || fail "expected --max-jobs to be a positive integer but got '$max_jobs'."
[[ "$time_budget" =~ ^[1-9][0-9]*$ ]] || fail "expected --time-budget to be a positive integer but got '$time_budget'."
command -v "$python" >/dev/null 2>&1 || fail "expected the Python '$python' on PATH but it is missing; pass --python."
# The version names the sdist file and its top folder (lmcache-V/), so it must be a plain release or pre-release.
[[ "$lmcache_version" =~ ^[0-9]+(\.[0-9]+)+((a|b|rc)[0-9]+)?$ ]] \
    || fail "expected --lmcache-version like 0.5.6 or 0.5.7rc2 but got '$lmcache_version'."
sdist="$carry/sdist/lmcache-$lmcache_version.tar.gz"
# What fills the carry folder, where pip reaches the package index (a wheel's run carries only rt/ and the wheel).
fill_carry="scripts/gpu-proof-carry.sh --carry $carry --lmcache-version $lmcache_version"
[ -z "$wheel" ] || fill_carry="scripts/gpu-proof-carry.sh --carry $carry --wheel $wheel"
if [ -n "$wheel" ]; then
    [ -f "$wheel" ] || fail "expected the LMCache wheel $wheel but it does not exist."
    stages="${stages//build/}"
elif wants build || wants lmcache-tests; then
    [ -f "$sdist" ] || fail "expected the LMCache sdist at $sdist but it is missing; first run: $fill_carry"
fi
if wants lmcache-tests && [ ! -f "$sdist" ]; then
    fail "expected the LMCache sdist at $sdist for its kernel tests but it is missing; drop lmcache-tests from --stages."
fi
if wants build; then
    compgen -G "$carry/wheels/*.whl" >/dev/null \
        || fail "expected the build's wheels in $carry/wheels but found none; first run: $fill_carry"
fi
if wants deps; then
    compgen -G "$carry/rt/*.whl" >/dev/null \
        || fail "expected LMCache's runtime wheels in $carry/rt but found none; first run: $fill_carry"
fi
# The geometry is validated (and printed) by the same code that runs it.
plan="$("$python" benchmarks/gpu_proof plan "${bench_args[@]}" "${tp_args[@]}" "${server_args[@]}")" \
    || fail "the benchmark plan is invalid (above)."

ipc_dir_name="ipc"
tp_dir_name="tp"
step_lines=(
    "machine        nvidia-smi, nvcc, gcc-12, $python + torch versions, cores, memory"
    "build          docker/vllm-lmcache/build-lmcache.sh --source $sdist --arch-list 9.0 --max-jobs $max_jobs (timed; build deps: PIP_FIND_LINKS=$carry/wheels $carry/rt)"
    "deps           pip install --no-index --no-deps $carry/rt/*.whl (LMCache's runtime dependencies)"
    "install        pip install --no-deps the built wheel${wheel:+ ($wheel)}; verify_lmcache.py --import-package"
    "kernels        benchmarks/gpu_proof kernels (cuda_ops vs LMCache's PyTorch fallback and a gather)"
    "ipc            benchmarks/gpu_proof ipc --device cuda (real lmcache server, CUDA IPC, align-mode block ids, phases, GB/s by chunks per request, pinned memcpy)"
    "tp             benchmarks/gpu_proof tp --device cuda (N rank processes sharing the GPU: the pod's server or one per rank; aggregate GB/s, N pinned copies, server CPU, p50/p99)"
    "probe          glm53 probe startup on each GPU-mode server log (+ the profile's example vllm.log)"
    "lmcache-tests  pytest tests/v1/test_mp_mem_kernels.py tests/v1/test_mem_kernels.py from the sdist (time left)"
)
if [ "$dry_run" = "1" ]; then
    echo "$prog: dry run: inputs ok; would write to $out"
    for line in "${step_lines[@]}"; do
        wants "${line%% *}" && echo "  $line"
    done
    echo "$plan"
    exit 0
fi

# ---- the run -------------------------------------------------------------------------------------------------------
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# build-lmcache.sh takes a path source only when it is absolute or starts with ./ or ../.
[ -f "$sdist" ] && sdist="$(cd "$(dirname "$sdist")" && pwd)/$(basename "$sdist")"
work="$(mktemp -d)"
logs="$work/logs"
mkdir -p "$logs"
summary="$out/summary.txt"
: >"$summary"
failed=0

record() {
    echo "$*" | tee -a "$summary"
}

# run_stage NAME COMMAND...: run one stage with its log, record ok/FAILED and the seconds it took.
run_stage() {
    local name="$1"
    shift
    local started=$SECONDS status=0
    echo "== $prog: $name"
    "$@" >"$logs/$name.log" 2>&1 || status=$?
    tail -n 25 "$logs/$name.log"
    if [ "$status" = "0" ]; then
        record "$name: ok ($((SECONDS - started)) s)"
    else
        record "$name: FAILED (exit $status, $((SECONDS - started)) s; see logs/$name.log)"
        failed=1
    fi
    return "$status"
}

stage_machine() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader \
        || return 1
    nvidia-smi
    command -v nvcc || ls /usr/local/cuda/bin/nvcc
    "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version | tail -n 2
    gcc-12 --version | head -n 1
    "$python" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
    echo "cores: $(nproc)"
    free -g | head -n 2
    uname -r
}

stage_deps() {
    "$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "$carry"/rt/*.whl
}

stage_build() {
    # pip splits a multi-valued option from the environment on whitespace: both folders are searched.
    PIP_NO_INDEX=1 PIP_FIND_LINKS="$(cd "$carry/wheels" && pwd) $(cd "$carry/rt" && pwd)" \
        bash docker/vllm-lmcache/build-lmcache.sh --source "$sdist" --python "$python" --wheel-dir "$out" \
        --arch-list 9.0 --max-jobs "$max_jobs"
}

stage_install() {
    local built="$wheel"
    if [ -z "$built" ]; then
        built="$(compgen -G "$out/lmcache-*.whl" | head -n 1)" || { echo "no wheel in $out"; return 1; }
    fi
    "$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --force-reinstall "$built"
    "$python" docker/vllm-lmcache/verify_lmcache.py --import-package
}

stage_lmcache_tests() {
    # Only tests/ and pytest.ini: with the sdist's lmcache/ beside them, pytest would import the uncompiled sources.
    local tree="$work/lmcache-tests" left
    left="$(time_left 15)" || return 1
    mkdir -p "$tree"
    tar -xzf "$sdist" -C "$tree" --strip-components=1 \
        "lmcache-$lmcache_version/tests" "lmcache-$lmcache_version/pytest.ini"
    # -v: one PASSED/FAILED line per test, so the log still counts them if the time budget cuts the run short.
    (cd "$tree" && LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 timeout "$left" "$python" -m pytest -v -p no:cacheprovider \
        -o log_cli=false tests/v1/test_mp_mem_kernels.py tests/v1/test_mem_kernels.py)
    local status=$?
    echo "passed: $(grep -c ' PASSED' "$logs/lmcache-tests.log"), failed: $(grep -c ' FAILED' "$logs/lmcache-tests.log")"
    return "$status"
}

stage_kernels() {
    "$python" benchmarks/gpu_proof kernels --out "$out"
}

# time_left RESERVE: the seconds a timed stage may run, the time left less RESERVE, what the later stages need to
# report; with under 30 of them it fails, saying the stage is skipped.
time_left() {
    local left=$((time_budget - SECONDS - $1))
    if [ "$left" -lt 30 ]; then
        echo "skipped: only ${left}s of the ${time_budget}s budget left" >&2
        return 1
    fi
    echo "$left"
}

# run_transfer COMMAND RESERVE DIR ARGS...: `benchmarks/gpu_proof COMMAND` on the GPU in the time left less RESERVE,
# writing to $work/DIR, with ARGS and the --server-arg flags.
run_transfer() {
    local command="$1" reserve="$2" dir="$3" left
    shift 3
    left="$(time_left "$reserve")" || return 1
    PYTHONUNBUFFERED=1 timeout "$left" "$python" benchmarks/gpu_proof "$command" --device cuda --out "$work/$dir" \
        "$@" "${server_args[@]}"
}

stage_ipc() {
    run_transfer ipc 25 "$ipc_dir_name" "${bench_args[@]}"
}

stage_tp() {
    run_transfer tp 20 "$tp_dir_name" "${tp_args[@]}"
}

# The probe reads the real GPU-mode server log beside the profile's example vLLM log (no vLLM runs here): it must
# say ready (0). On the server log alone it must say "not yet" (3): the geometry lines come from vLLM's connector.
stage_probe() {
    local log profile chunk status all=0
    for log in "$work/$ipc_dir_name"/lmcache-server-*.log; do
        [ -f "$log" ] || { echo "no server logs from the ipc stage"; return 1; }
        profile="$(basename "$log" .log)"
        profile="${profile#lmcache-server-}"
        chunk="${profile##*-}"
        profile="${profile%-*}"
        status=0
        PYTHONPATH=src "$python" -m glm53 probe startup --profile "$profile" --chunk-size "$chunk" \
            --log "examples/logs/$profile/healthy/vllm.log" --log "$log" --state-dir "$(mktemp -d)" || status=$?
        echo "probe $profile@$chunk with example vllm.log + GPU server log: exit $status (expected 0)"
        [ "$status" = "0" ] || all=1
        status=0
        PYTHONPATH=src "$python" -m glm53 probe startup --profile "$profile" --chunk-size "$chunk" \
            --log "$log" --state-dir "$(mktemp -d)" || status=$?
        echo "probe $profile@$chunk with the GPU server log alone: exit $status (expected 3)"
        [ "$status" = "3" ] || all=1
    done
    return "$all"
}

for stage in machine build deps install kernels ipc tp probe lmcache-tests; do
    wants "$stage" || continue
    run_stage "$stage" "stage_${stage//-/_}" || true
done

[ -f "$work/$ipc_dir_name/ipc.json" ] && cp "$work/$ipc_dir_name/ipc.json" "$out/"
[ -f "$work/$tp_dir_name/tp.json" ] && cp "$work/$tp_dir_name/tp.json" "$out/"
cp "$work/$ipc_dir_name"/lmcache-server-*.log "$work/$ipc_dir_name"/*.phases.jsonl "$logs/" 2>/dev/null || true
mkdir -p "$logs/tp"
cp "$work/$tp_dir_name"/tp-* "$logs/tp/" 2>/dev/null || true
# The tables the benchmark prints last, in the summary (the JSON reports hold every number).
for table in "$out/kernels.txt" "$work/$ipc_dir_name/ipc.txt" "$work/$tp_dir_name/tp.txt"; do
    if [ -f "$table" ]; then
        cat "$table" >>"$summary"
    fi
done
rm -f "$out/kernels.txt"
tar -czf "$out/logs.tar.gz" -C "$work" logs
rm -rf "$work"
echo "== $prog: summary ($out)"
cat "$summary"
exit "$failed"
