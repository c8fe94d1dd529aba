#!/usr/bin/env bash
# Build TE's torch extension here for the offline H200 machine, so a device call installs it
# instead of building it there (about 90 s of device time a release).
#
#   bash matrix/prebuild_te_torch.sh V [V2 ...]
#
# Needs .te-wheelhouse/V/sm90/ (python -m matrix.slim_core V), Python 3.12, nvcc 13.0 and network
# to PyPI the first time: it makes a venv ($TE_TORCH_VENV, default ../venv312-te) with the torch
# the GPU machine has (2.11.0, CUDA 13.0 build, cp312) and cuDNN/NCCL headers. The extension is
# C++ only (TE's build_tools/pytorch.py: a CppExtension): it links torch by soname and finds TE's
# core library at import, so it depends on the torch version and the Python ABI, not on the GPU.
# Writes .te-wheelhouse/V/sm90/transformer_engine_torch-V-cp312-cp312-linux_x86_64.whl and
# TORCH_NOTE (how it was built), which matrix/gpu_live.sh installs and records; where it does not
# import there, gpu_live.sh builds from source as before.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/matrix/te_torch_build.sh"  # force_build
VENV=${TE_TORCH_VENV:-$ROOT/../venv312-te}
PY312=${PYTHON312:-$(command -v python3.12 || echo "$HOME/.pyenv/versions/3.12.1/bin/python")}
TORCH=2.11.0  # the GPU machine's torch (2.11.0+cu130); PyPI's 2.11.0 wheel is that build
(($#)) || { echo "usage: bash matrix/prebuild_te_torch.sh V [V2 ...]" >&2; exit 2; }

if [[ ! -x $VENV/bin/python ]]; then
    "$PY312" -m venv "$VENV"
    # torch's own pins, except NCCL: the GPU machine's 2.28.9 is not on PyPI for this platform,
    # and torch needs >= 2.28 symbols to import; the extension only reads nccl.h
    "$VENV/bin/python" -m pip install -q --no-deps "torch==$TORCH"
    "$VENV/bin/python" -m pip install -q "setuptools<82" wheel packaging pybind11 filelock "typing-extensions>=4.10" \
        sympy networkx jinja2 fsspec numpy ninja pydantic importlib-metadata \
        "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.2" \
        "cuda-bindings>=13.0.3,<14" nvidia-cudnn-cu13==9.19.0.56 nvidia-cusparselt-cu13==0.8.0 \
        nvidia-nvshmem-cu13==3.4.5 "nvidia-nccl-cu13>=2.28"
fi
PY=$VENV/bin/python
TORCH_SAYS=$("$PY" -c 'import torch; print(torch.__version__, torch.version.git_version[:12], torch._C._GLIBCXX_USE_CXX11_ABI)')
[[ $TORCH_SAYS == "$TORCH+cu130 "* ]] || { echo "expected torch $TORCH+cu130 in $VENV; found $TORCH_SAYS" >&2; exit 1; }
S=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
SRC=${TE_TORCH_SRC:-/tmp/te-torch-build/src}
if [[ -d /usr/lib/ccache ]]; then export PATH=/usr/lib/ccache:$PATH CCACHE_BASEDIR=$SRC; fi
versions() { "$PY" -c "from importlib.metadata import version as v; print('cudnn', v('nvidia-cudnn-cu13'), 'nccl', v('nvidia-nccl-cu13'))"; }

for V in "$@"; do
    D=$ROOT/.te-wheelhouse/$V/sm90
    [[ -f $D/transformer_engine_torch-$V.tar.gz ]] || { echo "no $D/transformer_engine_torch-$V.tar.gz: python -m matrix.slim_core $V first" >&2; exit 1; }
    rm -f "$D"/transformer_engine_torch-"$V"-*.whl "$D/TORCH_NOTE"
    WORK=$(mktemp -d)
    # one source path for every release, so ccache (where installed) reuses the objects of files
    # two releases share (2.16.0 and 2.16.1, 2.17.0 and 2.17.1 have the same sources)
    rm -rf "$SRC" && mkdir -p "$SRC" && tar xzf "$D/transformer_engine_torch-$V.tar.gz" -C "$SRC" --strip-components=1
    start=$SECONDS
    # the same switches as the build on the GPU machine (matrix/gpu_live.sh): NVTE_CUDA_ARCHS=90
    # also decides whether NCCL EP is compiled in
    # unforced (force_build), setup.py first tries to download a prebuilt wheel: the unreachable
    # proxy makes that fail at once, as offline on the GPU machine
    force=$(force_build "$D/transformer_engine_torch-$V.tar.gz") proxy=()
    [[ $force == TRUE ]] || proxy=(http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9)
    if ! (cd "$SRC" && env "${proxy[@]}" CPATH=/usr/local/cuda/include:$S/nvidia/cudnn/include:$S/nvidia/nccl/include:$S/nvidia/cu13/include \
        NVTE_PYTORCH_FORCE_BUILD=$force MAX_JOBS=$(nproc) NVTE_CUDA_ARCHS=90 \
        "$PY" -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$WORK" . > "$WORK/build.log" 2>&1); then
        tail -n 30 "$WORK/build.log"
        echo "TE $V: the torch extension did not build here (log: $WORK/build.log)" >&2
        exit 1
    fi
    took=$((SECONDS - start))
    WHEEL=$(cd "$WORK" && ls transformer_engine_torch-"$V"-*.whl)
    [[ $WHEEL == *-cp312-cp312-linux_x86_64.whl ]] || { echo "unexpected wheel $WHEEL (want cp312, linux_x86_64)" >&2; exit 1; }
    mv "$WORK/$WHEEL" "$D/"
    # what the GPU machine must offer: the glibc and libstdc++ symbol versions, the libraries by soname
    (cd "$WORK" && "$PY" -m zipfile -e "$D/$WHEEL" x)
    SO=$(find "$WORK/x" -name "transformer_engine_torch*.so")
    NEEDS=$(readelf -V "$SO" | grep -o 'GLIBC_[0-9.]*\|GLIBCXX_[0-9.]*\|CXXABI_[0-9.]*' | sort -uV | awk -F_ '{m[$1]=$0} END {for (k in m) printf "%s ", m[k]}')
    SONAMES=$(readelf -d "$SO" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    NOTE="built on $(uname -m) with Python 3.12 (cp312), torch $TORCH_SAYS (version, git, cxx11 abi), $(versions) headers,"
    NOTE+=" nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), gcc $(gcc -dumpfullversion), NVTE_CUDA_ARCHS=90,"
    NOTE+=" in ${took}s on $(nproc) cores; needs ${NEEDS}; links ${SONAMES}"
    echo "$NOTE" > "$D/TORCH_NOTE"
    echo "TE $V: $D/$WHEEL ($(du -h "$D/$WHEEL" | cut -f1)); $NOTE"
    echo "  $D holds $(du -sh "$D" | cut -f1) in all"
    rm -rf "$WORK"
done
