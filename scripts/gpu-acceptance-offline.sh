#!/bin/bash
# make test-gpu on a GPU machine with no network whose Python already has a CUDA torch (a lent
# device, an air-gapped node): build Horovod there against that torch, install hvdkit, run the
# acceptance. Prepare on a machine with network, in the checkout (.gpu/ is git-ignored there):
#   echo /.gpu/ >> .git/info/exclude; mkdir -p .gpu/whl
#   tar -xzf ~/.cache/hvdkit/src/horovod-0.28.1.tar.gz -C .gpu && scripts/install.sh --patch-only .gpu/horovod-0.28.1
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 -d .gpu/whl keras==<lock> namex optree cffi pycparser   # what it lacks
# then, there: OUT=<dir> bash scripts/gpu-acceptance-offline.sh   (about 4 min on an H100 with 16 cores)
# HOROVOD_BUILD_CUDA_CC_LIST defaults to that GPU's compute capability. Used on 2026-11-26 (docs/GPU.md).
set -u
OUT=${OUT:-build}; mkdir -p "$OUT"
exec > >(tee "$OUT/device.log") 2>&1
t0=$(date +%s)
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" || exit 2
NCCL_DIR=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])") || exit 2
ln -sf libnccl.so.2 "$NCCL_DIR/lib/libnccl.so"
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-$(python3 -c "import torch; print('%d%d' % torch.cuda.get_device_capability(0))")}
if ls .gpu/whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps .gpu/whl/*.whl || exit 4; fi
echo "== building Horovod for sm_$CC_LIST ($(( $(date +%s) - t0 ))s)"
( cd .gpu/horovod-0.28.1 && env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_DEBUG_INFO=1 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA_ROOT" \
    CUDA_HOME="$CUDA_ROOT" HOROVOD_NCCL_HOME="$NCCL_DIR" HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST" MAKEFLAGS="-j$(nproc)" \
    timeout 600 python3 -m pip install -v --no-build-isolation --no-deps --no-index . > "$OUT/horovod-build.log" 2>&1 ) \
  || { echo "Horovod build failed: $OUT/horovod-build.log"; grep -m5 -E "error|Error" "$OUT/horovod-build.log"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation . || exit 4
horovodrun --check-build
echo "== acceptance ($(( $(date +%s) - t0 ))s)"
PYTHONUNBUFFERED=1 python3 scripts/gpu_acceptance.py --out "$OUT"; rc=$?
echo "== done rc=$rc ($(( $(date +%s) - t0 ))s)"
exit $rc
