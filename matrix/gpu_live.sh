#!/usr/bin/env bash
# Live runs of the matrix on the offline GPU machine (docs/live-matrix.md has the whole plan).
#
#   bash matrix/gpu_live.sh --stage     copy every folder carried under .te-wheelhouse/V/ (sm90 from
#                                       matrix/slim_core.py, or the parts pN) to /root/te/V/, and
#                                       each source in .te-wheelhouse/sources/ to its release's folder
#   bash matrix/gpu_live.sh V [V2 ...]  stage what was carried, then for each TE release in turn:
#                                       install its wheels (the earlier release's uninstalled first),
#                                       install the prebuilt torch extension when one was carried
#                                       (matrix/prebuild_te_torch.sh) or else build it, preload the
#                                       cuBLASLt stub where TE needs it, run tests/gpu and tests/live,
#                                       write the record
#
# Results go to $OUT (at most 8 files come back): for each release V.json (the record, for
# matrix/live/) and V.log (everything printed for it, build-log tail included), optionally
# V.no-seed.json, and extra.log. A release whose TE does not build or import still gets V.json,
# saying why and what was tried. Environment:
#   TE_COMPAT_COMMIT=SHA     the commit this tree came from (it travels without .git): the record
#                            names it, beside a digest of the code that ran (matrix/provenance.py)
#   GPU_LIVE_NO_SEED_DEMO=1  after the real run, run tests/live again with TE's buffers left as
#                            allocated (TE_COMPAT_LIVE_NO_SEED=1): they must fail; record V.no-seed.json
#   GPU_LIVE_EXTRA='cmd'     run cmd once, after the last release (in the repository, with that
#                            release installed), log to extra.log; cmd may write up to 3 more files into $OUT
#   GPU_LIVE_STUB=1|0        force the cuBLASLt stub on or off (default: on for 2.13.x and 2.14.x,
#                            and for any release whose core library fails on that symbol)
#   GPU_LIVE_NEXT='V2 V3'    after staging (after GPU_LIVE_EXTRA when that is set), build these
#                            releases' torch extensions in the background, one after another, from
#                            sources staged here (carry .te-wheelhouse/sources): the process outlives
#                            the call while the machine stays warm, and V2's call installs its wheel
#                            (waiting for the build if it still runs) instead of building it
#   GPU_LIVE_BUILD=1         build the torch extension even when a prebuilt one was carried
#   GPU_LIVE_REBUILD=1       reinstall and rebuild a release an earlier call installed here
#   GPU_LIVE_BUDGET_S=560    seconds this script may use in all (a device call stops at 600)
#   GPU_LIVE_PYTEST_ARGS='-n 4'  more pytest arguments, e.g. pytest-xdist workers (the evidence of
#                            the live tests reaches the record from every worker)
#   TE_PARTS_ROOT=/root/te   where parts are gathered, one folder per release
set -eEuo pipefail

STEP="start"
on_error() { echo "gpu_live.sh: FAILED at step \"$STEP\" (line $1, exit $2)" >&2; }
trap 'on_error $LINENO $?' ERR

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/matrix/te_torch_build.sh"  # force_build
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
    for dir in "$ROOT"/.te-wheelhouse/*/*/; do
        [[ -d $dir ]] || continue
        v=$(basename "$(dirname "$dir")")
        mkdir -p "$PARTS_ROOT/$v"
        # a folder with the whole core wheel (matrix/slim_core.py) replaces any parts staged before
        if [[ -f $dir/CORE_NAME && -f $dir/$(cat "$dir/CORE_NAME") ]]; then
            rm -f "$PARTS_ROOT/$v"/core.part*
        fi
        cp "$dir"* "$PARTS_ROOT/$v/"
        n=$((n + 1))
    done
    local src
    for src in "$ROOT"/.te-wheelhouse/sources/transformer_engine_torch-*.tar.gz; do
        [[ -f $src ]] || continue
        v=${src##*/transformer_engine_torch-}
        v=${v%.tar.gz}
        mkdir -p "$PARTS_ROOT/$v"
        cp "$src" "$PARTS_ROOT/$v/"
        n=$((n + 1))
    done
    echo "staged $n carried folder(s) and source(s); now in $PARTS_ROOT:"
    for dir in "$PARTS_ROOT"/*/; do
        [[ -d $dir && $(basename "$dir") != stub ]] || continue
        echo "  $(basename "$dir"): $(ls "$dir" | grep -c '^core\.part' || true) core part(s), $(du -sh "$dir" | cut -f1)"
    done
}

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
    TRIED+=("preloaded a cuBLASLt stub defining cublasLtGroupedMatrixLayoutInit_internal")
    echo "LD_PRELOAD=$LD_PRELOAD (TE's grouped GEMM is unavailable in this run)"
}
try_import() { python3 -c 'import transformer_engine.pytorch, transformer_engine_torch, transformer_engine as t; print("TE", t.__version__, "imports")' 2>&1 | tail -n 3; }
import_with_stub() {  # sets IMPORT; preloads the stub once if the core lacks that cuBLASLt symbol
    IMPORT=$(try_import) || true
    echo "$IMPORT"
    if [[ $IMPORT == *"undefined symbol: cublasLtGroupedMatrixLayoutInit_internal"* && $STUB_ON == 0 && ${GPU_LIVE_STUB:-auto} != 0 ]]; then
        build_stub
        IMPORT=$(try_import) || true
        echo "$IMPORT"
    fi
}
uninstall_te() {
    local dist
    for dist in transformer-engine-torch transformer-engine transformer-engine-cu13 transformer-engine-cu12; do
        if python3 -m pip show -q "$dist" >/dev/null 2>&1; then
            python3 -m pip uninstall -q -y "$dist"
            echo "uninstalled $dist"
        fi
    done
}

run_tests() {  # $1: junit file, $2: evidence file, then the test paths
    local junit=$1 evidence=$2
    shift 2
    need_time 40
    TE_COMPAT_LIVE_EVIDENCE=$evidence TE_COMPAT_FSDP_RECORD=$OUT PYTHONUNBUFFERED=1 timeout $(($(left) - 25)) \
        python3 -m pytest -q -p no:cacheprovider -rfEs ${GPU_LIVE_PYTEST_ARGS:-} "$@" --junitxml="$junit" ||
        echo "pytest exit status $?"
}
record() {  # $1: junit ("" when no test ran), $2: evidence; BUILD says how TE was built, CNL why it did not load
    local args=(--evidence "$2" --out "$OUT" --build "$BUILD" --release "$V")
    [[ -n $CNL ]] && args+=(--could-not-load "$CNL")
    local t
    for t in "${TRIED[@]}"; do args+=(--tried "$t"); done
    (cd "$ROOT" && python3 -m matrix.live_record ${1:+"$1"} "${args[@]}")
}
summary() {
    python3 - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    print(f"{path.rsplit('/', 1)[-1]}: TE {r['release']} on {r['gpu']}: {r['passed']} passed, {r['failed']} failed, "
          f"{r['skipped']} skipped; {r['seeding']}; commit {r.get('commit') or 'NOT RECORDED'}")
    if r.get("could_not_load"):
        print(f"  COULD NOT LOAD: {r['could_not_load']['why']}")
        for t in r["could_not_load"]["tried"]:
            print(f"    tried: {t}")
    for name, why in sorted(r["failed_tests"].items()):
        print(f"  FAILED {name}: {why[:160]}")
    for note in r["notes"]:
        print(f"  note: {note}")
PY
}

# the core wheel of release V, whole, in $P (from parts, or carried whole); sets CORE and CORE_NOTE
assemble_core() {
    STEP="check the parts"
    [[ -f $P/CORE_NAME ]] || die "no $P/CORE_NAME: carry .te-wheelhouse/$V/sm90 (or every .te-wheelhouse/$V/pN; the last holds CORE_NAME)"
    CORE=$(cat "$P/CORE_NAME")
    CORE_NOTE=$(cat "$P/CORE_NOTE" 2>/dev/null || echo "core wheel as published")
    local parts i
    mapfile -t parts < <(cd "$P" && { ls core.part* 2>/dev/null || true; } | sort -V)
    if ((${#parts[@]})); then
        for i in "${!parts[@]}"; do
            [[ ${parts[$i]} == "core.part$i" ]] || die "core parts are not contiguous: have ${parts[*]}; missing core.part$i (carry each .te-wheelhouse/$V/pN)"
        done
        STEP="assemble the core wheel"
        (cd "$P" && cat "${parts[@]}" > "$CORE")
    elif [[ ! -f $P/$CORE ]]; then
        die "neither core parts nor $CORE in $P"
    fi
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).namelist()" "$P/$CORE" \
        || die "$CORE is not a whole wheel (a part missing or cut short?)"
    echo "core wheel $CORE: ${#parts[@]} part(s), $(du -h "$P/$CORE" | cut -f1); $CORE_NOTE"
}

pip_build() {  # $1: install | wheel, $2: the source archive, then pip's other arguments
    local how=$1 src=$2 S
    shift 2
    S=$(python3 -c 'import site; print(site.getsitepackages()[0])')
    CPATH=/usr/local/cuda/include:$S/nvidia/cudnn/include:$S/nvidia/nccl/include:$S/nvidia/cu13/include \
        NVTE_PYTORCH_FORCE_BUILD=$(force_build "$src") MAX_JOBS=16 NVTE_CUDA_ARCHS=90 \
        python3 -m pip "$how" -q --no-index --no-deps --no-build-isolation "$@" "$src"
}

background_builds() {  # GPU_LIVE_NEXT: build those extensions in a process that outlives the call
    local v list=""
    if [[ -n ${GPU_LIVE_NEXT:-} ]] && ! command -v setsid >/dev/null; then
        echo "background builds skipped: no setsid here (a plain background process ends with the call)"
        return 0
    fi
    for v in ${GPU_LIVE_NEXT:-}; do
        if [[ -f $PARTS_ROOT/$v/transformer_engine_torch-$v.tar.gz ]] && ! ls "$PARTS_ROOT/$v/transformer_engine_torch-$v-"*.whl >/dev/null 2>&1 \
            && [[ ! -f $PARTS_ROOT/$v/BUILDING ]]; then
            touch "$PARTS_ROOT/$v/BUILDING"
            list+=" $v"
        else
            echo "background build of TE $v: skipped (no staged source, a wheel already, or building)"
        fi
    done
    [[ -n $list ]] || return 0
    export -f force_build pip_build
    setsid nohup bash -c '
        for v in '"$list"'; do
            d='"$PARTS_ROOT"'/$v; start=$SECONDS
            if (cd "$d" && pip_build wheel "transformer_engine_torch-$v.tar.gz" -w "$d" > bg-build.log 2>&1); then
                echo "built on the GPU machine from transformer_engine_torch-$v.tar.gz (NVTE_CUDA_ARCHS=90, MAX_JOBS=16) in $((SECONDS - start))s, in the background of an earlier call" > "$d/TORCH_NOTE"
            fi
            rm -f "$d/BUILDING"
        done' > "$PARTS_ROOT/background-builds.log" 2>&1 < /dev/null &
    echo $! > "$PARTS_ROOT/background-builds.pid"
    echo "background build started for TE$list (pid $!; each release marks $PARTS_ROOT/V/BUILDING while it builds)"
}

wait_for_background_build() {  # V's extension may be building in the background of an earlier call
    [[ -f $P/BUILDING ]] || return 0
    STEP="wait for the background build"
    local start=$SECONDS
    echo "TE $V's torch extension is building in the background (an earlier call started it): waiting"
    local pid
    pid=$(cat "$PARTS_ROOT/background-builds.pid" 2>/dev/null || echo 0)
    while [[ -f $P/BUILDING ]] && (($(left) > 150)) && kill -0 "$pid" 2>/dev/null; do sleep 2; done
    echo "waited $((SECONDS - start))s; $([[ -f $P/BUILDING ]] && echo "still building: giving up on it" || echo done)"
    [[ ! -f $P/bg-build.log ]] || tail -n 3 "$P/bg-build.log"
}

build_extension() {  # from the source archive; returns 1 (CNL set) when it does not build
    STEP="build the torch extension"
    local start=$SECONDS
    need_time 200
    if (cd "$P" && timeout $(($(left) - 90)) bash -c "$(declare -f force_build pip_build); pip_build install transformer_engine_torch-$V.tar.gz" \
        > te-build.log 2>&1); then
        BUILD="core $CORE ($CORE_NOTE); torch extension built from transformer_engine_torch-$V.tar.gz on this machine"
        BUILD+=" (NVTE_CUDA_ARCHS=90, MAX_JOBS=16) in $((SECONDS - start))s"
        TRIED+=("built the torch extension from transformer_engine_torch-$V.tar.gz: built in $((SECONDS - start))s")
        return 0
    fi
    tail -n 40 "$P/te-build.log"
    CNL="the torch extension did not build: $({ grep -m1 ' error: ' "$P/te-build.log" || grep -v '^\s*$' "$P/te-build.log" | tail -n 1; } | cut -c1-200)"
    TRIED+=("built the torch extension from transformer_engine_torch-$V.tar.gz (NVTE_CUDA_ARCHS=90): failed after $((SECONDS - start))s")
    BUILD="core $CORE ($CORE_NOTE); the torch extension did not build (last 40 lines of te-build.log in $V.log)"
    return 1
}

install_extension() {  # prebuilt wheel when carried, else (or when it does not import) a build
    wait_for_background_build
    STEP="install the torch extension"
    local wheel
    wheel=$(cd "$P" && ls "transformer_engine_torch-$V-"*.whl 2>/dev/null | head -n 1 || true)
    if [[ -n $wheel && ${GPU_LIVE_BUILD:-0} != 1 ]]; then
        python3 -m pip install -q --no-index --no-deps "$P/$wheel"
        local built
        built=$(cat "$P/TORCH_NOTE" 2>/dev/null || echo "built elsewhere")
        import_with_stub
        if [[ $IMPORT == *" imports"* ]]; then
            BUILD="core $CORE ($CORE_NOTE); torch extension: prebuilt $wheel ($built)"
            TRIED+=("installed the prebuilt torch extension $wheel: it imports")
            return 0
        fi
        TRIED+=("installed the prebuilt torch extension $wheel: import failed: $(echo "$IMPORT" | tail -n 1 | cut -c1-200)")
        if [[ $IMPORT != *"transformer_engine_torch"* && $IMPORT != *"undefined symbol: _Z"* ]]; then
            BUILD="core $CORE ($CORE_NOTE); torch extension: prebuilt $wheel ($built)"
            return 0  # the core failed, not the extension: a build would fail the same way
        fi
        echo "the prebuilt extension does not import here: building it from source instead"
        python3 -m pip uninstall -q -y transformer-engine-torch
    fi
    build_extension || return 1
    import_with_stub
}

# one release, in a subshell of its own (its LD_PRELOAD and failures stay there); status in $1
run_release() {
    set -eEuo pipefail  # a pipeline stage: set again what the caller turned off for it
    trap 'on_error $LINENO $?' ERR
    local status_file=$1
    STUB_ON=0 CNL="" BUILD="" IMPORT="" TRIED=()
    WORK=$(mktemp -d)
    echo "==== TE $V: $(date -u +%FT%TZ), ${SECONDS}s of ${BUDGET}s used"
    P=$PARTS_ROOT/$V
    assemble_core

    STEP="remove an earlier TE"
    local installed reuse=0
    installed=$(python3 -c 'from importlib.metadata import version; print(version("transformer_engine_torch"))' 2>/dev/null || true)
    if [[ $installed == "$V" && ${GPU_LIVE_REBUILD:-0} != 1 ]]; then
        reuse=1
        echo "TE $V is already installed here (an earlier call): reusing it (GPU_LIVE_REBUILD=1 reinstalls)"
    else
        uninstall_te
        STEP="install the wheels"
        (cd "$P" && python3 -m pip install -q --no-index --no-deps $(ls ./*.whl | grep -v '/transformer_engine_torch-'))
        TRIED+=("installed $CORE ($CORE_NOTE) and the transformer_engine $V wheel")
    fi

    case "${GPU_LIVE_STUB:-auto}:$V" in
        1:* | auto:2.13.* | auto:2.14.*) build_stub ;;
    esac

    if ((reuse)); then
        BUILD="reused the TE $V an earlier call installed here (core $CORE)"
        import_with_stub
    elif ! install_extension; then
        STEP="write the could-not-load record"
        record "" "$WORK/none.json"
        summary "$OUT/$V.json"
        echo "RESULT: TE $V could not load: $CNL"
        echo 1 > "$status_file"
        return 0
    fi
    echo "TE build: $BUILD"
    STEP="import TE"
    if [[ $IMPORT != *" imports"* ]]; then
        CNL="TE did not import: $(echo "$IMPORT" | tail -n 1 | cut -c1-240)"
        TRIED+=("import transformer_engine.pytorch and transformer_engine_torch: failed")
        echo "WARNING: TE $V does not import; the live tests will skip, and the record says why"
    fi

    cd "$ROOT"
    STEP="run tests/gpu and tests/live"
    run_tests "$WORK/$V.junit.xml" "$WORK/$V.evidence.json" tests/gpu tests/live
    STEP="write the record"
    record "$WORK/$V.junit.xml" "$WORK/$V.evidence.json"
    [[ -f $OUT/$V.json ]] || die "no $OUT/$V.json: te_compat read another release than $V? \$OUT holds: $(ls "$OUT")"

    local status=0 failed noseed
    if [[ ${GPU_LIVE_NO_SEED_DEMO:-0} == 1 && -z $CNL ]]; then
        STEP="no-seed demonstration"
        TE_COMPAT_LIVE_NO_SEED=1 run_tests "$WORK/$V.no-seed.junit.xml" "$WORK/$V.no-seed.evidence.json" tests/live
        TE_COMPAT_LIVE_NO_SEED=1 record "$WORK/$V.no-seed.junit.xml" "$WORK/$V.no-seed.evidence.json"
    fi

    STEP="summary"
    summary "$OUT/$V.json" $([[ -f $OUT/$V.no-seed.json ]] && echo "$OUT/$V.no-seed.json")
    failed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed"])' "$OUT/$V.json")
    ((failed == 0)) || { echo "RESULT: TE $V: $failed live test(s) FAILED"; status=1; }
    [[ -z $CNL ]] || { echo "RESULT: TE $V could not load: $CNL"; status=1; }
    if [[ -f $OUT/$V.no-seed.json ]]; then
        noseed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed"])' "$OUT/$V.no-seed.json")
        if ((noseed == 0)); then
            echo "RESULT: TE $V: the no-seed run had NO failure: some comparison can pass on TE's buffers as allocated"
            status=1
        else
            echo "RESULT: TE $V: the no-seed run failed $noseed test(s), as it must"
        fi
    fi
    echo "$status" > "$status_file"
}

if [[ ${1:-} == "--stage" ]]; then
    stage
    exit 0
fi
(($#)) || die "usage: bash matrix/gpu_live.sh V [V2 ...] (TE releases like 2.20.2) | --stage"
for V in "$@"; do
    [[ $V =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || die "not a TE release: $V (usage: bash matrix/gpu_live.sh V [V2 ...] | --stage)"
done

set +e
trap - ERR
STAGE_LOG=$(mktemp)
{
    echo "gpu_live.sh $* (results in $OUT): $(date -u +%FT%TZ), repository $ROOT, budget ${BUDGET}s"
    echo "commit: ${TE_COMPAT_COMMIT:-NOT SET: the records name no commit unless git works here}"
    stage
} 2>&1 | tee "$STAGE_LOG"
[[ -n ${GPU_LIVE_EXTRA:-} ]] || background_builds 2>&1 | tee -a "$STAGE_LOG"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
# mok's compiled memory reader: the tree travels as source, so build it for this machine's Python
(cd "$ROOT" && python3 setup.py -q build_ext --inplace > /tmp/build_ext.log 2>&1) ||
    { tail -n 5 /tmp/build_ext.log; echo "note: mok's compiled memory reader did not build; refreshes read in Python"; }
export NVTE_GROUPED_LINEAR_SINGLE_PARAM=1  # single grouped expert weights are opt-in (te-releases/facts.md)
STATUS=0
for V in "$@"; do
    status_file=$(mktemp)
    cp "$STAGE_LOG" "$OUT/$V.log"
    (run_release "$status_file") 2>&1 | tee -a "$OUT/$V.log"
    s=$(cat "$status_file")
    [[ -n $s ]] || echo "gpu_live.sh: TE $V stopped early (its log says where)" | tee -a "$OUT/$V.log"
    [[ ${s:-1} == 0 ]] || STATUS=1
done

if [[ -n ${GPU_LIVE_EXTRA:-} ]]; then
    if (($(left) < 20)); then
        echo "extra command skipped: only $(left) s left"
        STATUS=1
    else
        echo "extra: $GPU_LIVE_EXTRA"
        EXTRA_STATUS=0
        (cd "$ROOT" && timeout $(($(left) - 5)) bash -c "$GPU_LIVE_EXTRA") > "$OUT/extra.log" 2>&1 || EXTRA_STATUS=$?
        tail -n 15 "$OUT/extra.log"
        echo "extra command exit status: $EXTRA_STATUS (log: extra.log)"
        ((EXTRA_STATUS == 0)) || STATUS=1
    fi
    background_builds
fi
echo "==== gpu_live.sh $* done in ${SECONDS}s of ${BUDGET}s; files in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit "$STATUS"
