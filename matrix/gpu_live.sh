#!/usr/bin/env bash
# One live run of the matrix on the offline GPU machine (matrix/LIVE.md has the whole plan).
#
#   bash matrix/gpu_live.sh --stage     copy the wheelhouse parts carried into .te-wheelhouse/V/pN
#                                       to /root/te/V/ (a call that only brings a part)
#   bash matrix/gpu_live.sh V           stage what was carried, then for TE release V: assemble
#                                       the core wheel, install the wheels, build the torch
#                                       extension, preload the cuBLASLt stub where TE needs it,
#                                       run tests/gpu and tests/live, write the record
#
# Results go to $OUT (at most 8 files come back): V.json (the record, for matrix/live/),
# V.junit.xml, V.log (everything printed, build-log tail included), and optionally
# V.no-seed.json and extra.log. Environment:
#   GPU_LIVE_NO_SEED_DEMO=1  after the real run, run tests/live again with TE's buffers left as
#                            allocated (TE_COMPAT_LIVE_NO_SEED=1): they must fail; record V.no-seed.json
#   GPU_LIVE_EXTRA='cmd'     run cmd last (in the repository, same environment), log to extra.log;
#                            cmd may write up to 3 more files into $OUT
#   GPU_LIVE_STUB=1|0        force the cuBLASLt stub on or off (default: on for 2.13.x and 2.14.x,
#                            and for any release whose core library fails on that symbol)
#   GPU_LIVE_BUDGET_S=560    seconds this script may use in all (a device call stops at 600)
#   TE_PARTS_ROOT=/root/te   where parts are gathered, one folder per release
set -eEuo pipefail

STEP="start"
on_error() { echo "gpu_live.sh: FAILED at step \"$STEP\" (line $1, exit $2)" >&2; }
trap 'on_error $LINENO $?' ERR

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PARTS_ROOT=${TE_PARTS_ROOT:-/root/te}
BUDGET=${GPU_LIVE_BUDGET_S:-560}
OUT=${OUT:-$(mktemp -d)}  # the device tool sets OUT; elsewhere a fresh folder
mkdir -p "$OUT"

die() { echo "gpu_live.sh: FAILED at step \"$STEP\": $*" >&2; exit 1; }
left() { echo $((BUDGET - SECONDS)); }
need_time() { (($(left) >= $1)) || die "only $(left) s left of $BUDGET s, need $1 s"; }

stage() {
    STEP="stage carried parts"
    local dir v n=0
    for dir in "$ROOT"/.te-wheelhouse/*/p*/; do
        [[ -d $dir ]] || continue
        v=$(basename "$(dirname "$dir")")
        mkdir -p "$PARTS_ROOT/$v"
        cp "$dir"* "$PARTS_ROOT/$v/"
        n=$((n + 1))
    done
    echo "staged $n carried part folder(s); now in $PARTS_ROOT:"
    for dir in "$PARTS_ROOT"/*/; do
        [[ -d $dir ]] && echo "  $(basename "$dir"): $(ls "$dir" | grep -c '^core\.part' || true) core part(s), $(du -sh "$dir" | cut -f1)"
    done
}

STUB_ON=0
WORK=$(mktemp -d)
STUB_SO=$PARTS_ROOT/libcublaslt_grouped_stub.so
build_stub() {
    STEP="build the cuBLASLt stub"
    local src=$PARTS_ROOT/stub
    mkdir -p "$src"
    # verbatim copies of ../shared/gpu/cublaslt-grouped-stub.{c,map}, which do not travel to the
    # GPU machine (tests/live/test_record_writer.py checks they still agree)
    cat > "$src/cublaslt-grouped-stub.c" <<'STUB_C'
/* Stand-in for one cuBLASLt entry point that TE 2.13/2.14 core libraries bind at load time but
 * the GPU machine's cuBLASLt 13.1.0.3 lacks. It only makes TE loadable for tests that never run a
 * grouped GEMM; any call reports CUBLAS_STATUS_NOT_SUPPORTED (15). Build and use on that machine:
 *   gcc -shared -fPIC -o /root/libcublaslt_grouped_stub.so cublaslt-grouped-stub.c \
 *       -Wl,--version-script=cublaslt-grouped-stub.map
 *   export LD_PRELOAD=/root/libcublaslt_grouped_stub.so
 */
int cublasLtGroupedMatrixLayoutInit_internal(void) { return 15; }
STUB_C
    cat > "$src/cublaslt-grouped-stub.map" <<'STUB_MAP'
libcublasLt.so.13 { global: cublasLtGroupedMatrixLayoutInit_internal; };
STUB_MAP
    gcc -shared -fPIC -o "$STUB_SO" "$src/cublaslt-grouped-stub.c" -Wl,--version-script="$src/cublaslt-grouped-stub.map"
    export LD_PRELOAD=$STUB_SO${LD_PRELOAD:+:$LD_PRELOAD}
    STUB_ON=1
    echo "LD_PRELOAD=$LD_PRELOAD (TE's grouped GEMM is unavailable in this run)"
}
try_import() { python3 -c 'import transformer_engine.pytorch, transformer_engine_torch, transformer_engine as t; print("TE", t.__version__, "imports")' 2>&1 | tail -n 3; }

run_tests() {  # $1: junit file, $2: evidence file, then the test paths
    local junit=$1 evidence=$2
    shift 2
    need_time 40
    TE_COMPAT_LIVE_EVIDENCE=$evidence PYTHONUNBUFFERED=1 timeout $(($(left) - 25)) \
        python3 -m pytest -q -p no:cacheprovider -rfEs "$@" --junitxml="$junit" || echo "pytest exit status $?"
}
record() {  # $1: junit, $2: evidence; BUILD says how TE was built
    python3 -m matrix.live_record "$1" --evidence "$2" --out "$OUT" --build "$BUILD"
}

summary() {
    python3 - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    print(f"{path.rsplit('/', 1)[-1]}: TE {r['release']} on {r['gpu']}: {r['passed']} passed, {r['failed']} failed, "
          f"{r['skipped']} skipped; {r['seeding']}")
    for name, why in sorted(r["failed_tests"].items()):
        print(f"  FAILED {name}: {why[:160]}")
    for note in r["notes"]:
        print(f"  note: {note}")
PY
}
if [[ ${1:-} == "--stage" ]]; then
    stage
    exit 0
fi
[[ $# -eq 1 && $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || die "usage: bash matrix/gpu_live.sh V (a TE release like 2.20.2) | --stage"
V=$1

main() {
    set -eEuo pipefail  # a pipeline stage: set again what the caller turned off for it
    trap 'on_error $LINENO $?' ERR
    echo "gpu_live.sh $V (results in $OUT): $(date -u +%FT%TZ), repository $ROOT, budget ${BUDGET}s"
    stage
    P=$PARTS_ROOT/$V

    STEP="check the parts"
    [[ -f $P/CORE_NAME ]] || die "no $P/CORE_NAME: the last part of .te-wheelhouse/$V was not carried (it holds CORE_NAME)"
    CORE=$(cat "$P/CORE_NAME")
    mapfile -t PARTS < <(cd "$P" && ls core.part* 2>/dev/null | sort -V)
    if ((${#PARTS[@]})); then
        for i in "${!PARTS[@]}"; do
            [[ ${PARTS[$i]} == "core.part$i" ]] || die "core parts are not contiguous: have ${PARTS[*]}; missing core.part$i (carry each .te-wheelhouse/$V/pN)"
        done
        STEP="assemble the core wheel"
        (cd "$P" && cat "${PARTS[@]}" > "$CORE")
    elif [[ ! -f $P/$CORE ]]; then
        die "neither core parts nor $CORE in $P"
    fi
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).namelist()" "$P/$CORE" \
        || die "$CORE is not a whole wheel (a part missing or cut short?)"
    echo "core wheel $CORE: ${#PARTS[@]} part(s), $(du -h "$P/$CORE" | cut -f1)"

    STEP="remove an earlier TE"
    INSTALLED=$(python3 -c 'from importlib.metadata import version; print(version("transformer_engine_torch"))' 2>/dev/null || true)
    REUSE=0
    if [[ $INSTALLED == "$V" && ${GPU_LIVE_REBUILD:-0} != 1 ]]; then
        REUSE=1
        echo "TE $V is already installed and built here (an earlier call): reusing it (GPU_LIVE_REBUILD=1 rebuilds)"
    else
        for dist in transformer-engine-torch transformer-engine transformer-engine-cu13 transformer-engine-cu12; do
            if python3 -m pip show -q "$dist" >/dev/null 2>&1; then
                python3 -m pip uninstall -q -y "$dist"
                echo "uninstalled $dist"
            fi
        done
        STEP="install the wheels"
        (cd "$P" && python3 -m pip install -q --no-index --no-deps ./*.whl)
    fi

    case "${GPU_LIVE_STUB:-auto}:$V" in
        1:* | auto:2.13.* | auto:2.14.*) build_stub ;;
    esac

    STEP="build the torch extension"
    S=$(python3 -c 'import site; print(site.getsitepackages()[0])')
    BUILD_START=$SECONDS
    if ((REUSE)); then
        echo "torch extension: reused"
    elif need_time 200 && ! (cd "$P" && CPATH=/usr/local/cuda/include:$S/nvidia/cudnn/include:$S/nvidia/nccl/include:$S/nvidia/cu13/include \
        NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=16 NVTE_CUDA_ARCHS=90 \
        timeout $(($(left) - 90)) python3 -m pip install -q --no-index --no-deps --no-build-isolation \
        "transformer_engine_torch-$V.tar.gz" > te-build.log 2>&1); then
        tail -n 40 "$P/te-build.log"
        die "the torch extension did not build (last 40 lines of $P/te-build.log above)"
    fi
    BUILD="core $CORE; torch extension built from transformer_engine_torch-$V.tar.gz on this machine"
    BUILD+=" (NVTE_CUDA_ARCHS=90, MAX_JOBS=16) in $((SECONDS - BUILD_START))s"
    ((REUSE)) && BUILD="reused the TE $V an earlier call installed here ($BUILD)" || echo "torch extension: $BUILD"

    STEP="import TE"
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
    export NVTE_GROUPED_LINEAR_SINGLE_PARAM=1
    IMPORT=$(try_import) || true
    echo "$IMPORT"
    if [[ $IMPORT == *"undefined symbol: cublasLtGroupedMatrixLayoutInit_internal"* && $STUB_ON == 0 && ${GPU_LIVE_STUB:-auto} != 0 ]]; then
        build_stub
        IMPORT=$(try_import) || true
        echo "$IMPORT"
    fi
    [[ $IMPORT == *" imports"* ]] || echo "WARNING: TE $V does not import; the live tests will skip, and the record says why"

    cd "$ROOT"
    STEP="run tests/gpu and tests/live"
    run_tests "$OUT/$V.junit.xml" "$WORK/$V.evidence.json" tests/gpu tests/live
    STEP="write the record"
    record "$OUT/$V.junit.xml" "$WORK/$V.evidence.json"
    RELEASE_JSON=$OUT/$V.json
    [[ -f $RELEASE_JSON ]] || die "no $RELEASE_JSON: te_compat read another release than $V? \$OUT holds: $(ls "$OUT")"

    if [[ ${GPU_LIVE_NO_SEED_DEMO:-0} == 1 ]]; then
        STEP="no-seed demonstration"
        TE_COMPAT_LIVE_NO_SEED=1 run_tests "$WORK/$V.no-seed.junit.xml" "$WORK/$V.no-seed.evidence.json" tests/live
        TE_COMPAT_LIVE_NO_SEED=1 record "$WORK/$V.no-seed.junit.xml" "$WORK/$V.no-seed.evidence.json"
    fi

    EXTRA_STATUS=0
    if [[ -n ${GPU_LIVE_EXTRA:-} ]]; then
        STEP="extra command"
        need_time 20
        echo "extra: $GPU_LIVE_EXTRA"
        timeout $(($(left) - 5)) bash -c "$GPU_LIVE_EXTRA" > "$OUT/extra.log" 2>&1 || EXTRA_STATUS=$?
        tail -n 15 "$OUT/extra.log"
    fi

    STEP="summary"
    echo "==== gpu_live.sh $V summary (${SECONDS}s of ${BUDGET}s) ===="
    echo "$IMPORT" | tail -n 1
    summary "$RELEASE_JSON" $([[ -f $OUT/$V.no-seed.json ]] && echo "$OUT/$V.no-seed.json")
    [[ -n ${GPU_LIVE_EXTRA:-} ]] && echo "extra command exit status: $EXTRA_STATUS (log: extra.log)"
    FAILED=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed"])' "$RELEASE_JSON")
    STATUS=0
    ((FAILED == 0)) || { echo "RESULT: $FAILED live test(s) FAILED"; STATUS=1; }
    if [[ ${GPU_LIVE_NO_SEED_DEMO:-0} == 1 ]]; then
        NOSEED=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed"])' "$OUT/$V.no-seed.json")
        if ((NOSEED == 0)); then
            echo "RESULT: the no-seed run had NO failure: some comparison can pass on TE's buffers as allocated"
            STATUS=1
        else
            echo "RESULT: the no-seed run failed $NOSEED test(s), as it must"
        fi
    fi
    ((EXTRA_STATUS == 0)) || STATUS=1
    echo "files in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
    echo "$STATUS" > "$STATUS_FILE"
}

STATUS_FILE=$(mktemp)
set +e
trap - ERR
main 2>&1 | tee -a "$OUT/$V.log"
STATUS=$(cat "$STATUS_FILE")
exit "${STATUS:-1}"  # empty: main stopped early, and said where
