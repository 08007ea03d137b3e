#!/usr/bin/env bash
# The GPU machine's measurements (issue 33), as one script for a lent GPU
# machine that has torch but no Rust: builds nothing; installs minato's
# wheels carried in .gpu/new/ and .gpu/old/ (abi3, built on the development
# machine) under /tmp/new and /tmp/old, and runs the tests on the GPU and
# the benchmarks, new and old back to back. Output is tee'd to $OUT.
# tests/gpu/test_accelerate_gpu.py needs accelerate, which the GPU machine
# lacks (no network): carry its wheels in .gpu/extra/, fetched here with
#   pip download accelerate==1.15.0 --dest .gpu/extra --only-binary=:all: \
#       --python-version 3.12 --platform manylinux2014_x86_64 --no-deps
#   (and the same for huggingface_hub, safetensors, psutil, pyyaml, filelock,
#   fsspec, tqdm, httpx, hf-xet and their dependencies)
#
#   bash benchmarks/gpu_session.sh [tests] [train] [digest] [scaling] [manycore] [neighbour] [collate]
#
# `collate` (not run by default: about two minutes, untimed on a GPU machine
# so far) runs user_collate.py at batch 128, new and old: where batches of a
# user's collate_fn and of the defaults are collated on 16 busy cores.
# Wall time of each part on the H200 (session 2026-11-27 (8)), for planning a
# lease of 15 minutes: tests 26 s, train 145 s (new b c d d+ 68 s, old b d d+
# 77 s; d= adds about 15 s), manycore 24 s, digest 62 s, scaling 170 s (PIL
# new 45 s, PIL old 94 s, minato.io new 30 s), neighbour 75 s: all of them
# about 520 s, in one call of 570 s (the machine's start, a minute or two,
# is not counted in the call's limit but is in the lease).
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp}"
exec > >(tee -a "$OUT/gpu_session.txt") 2>&1
cd "$(dirname "$0")/.."
if [ ! -d /tmp/new/minato ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/new .gpu/new/*.whl
    [ -d .gpu/old ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/old .gpu/old/*.whl
    [ -d .gpu/extra ] && python3 -m pip install -q --no-index --find-links .gpu/extra \
        --target /tmp/extra accelerate
fi
export PYTHONPATH=/tmp/new
[ -d /tmp/extra ] && export PYTHONPATH=$PYTHONPATH:/tmp/extra
cp /tmp/new/minato/_minato*.so minato/
step() { local t=$1; shift; echo "=== [$(date +%T)] $*"; timeout "$t" "$@"; echo "--- rc $? [$(date +%T)]"; }
parts="${*:-tests train digest scaling manycore neighbour}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
for part in $parts; do
    case $part in
    tests)
        step 150 python3 -m pytest -q -p no:cacheprovider --timeout 90 tests/gpu tests/test_device.py \
            tests/test_collate.py tests/test_training_thread.py ;;
    train)
        (cd benchmarks && step 170 python3 gpu_train.py --only b c d d= d+ --steps 60 --alone-batches 20 &&
            step 120 env PYTHONPATH=/tmp/old python3 gpu_train.py --only b d d+ --steps 60 --alone-batches 20) ;;
    digest)
        for _ in 1 2; do
            (cd benchmarks && step 40 python3 seeded_digest.py --loader minato &&
                step 40 python3 seeded_digest.py --loader torch)
        done ;;
    scaling)
        (cd benchmarks && step 110 python3 scaling.py --decode pil --batches 15 &&
            step 110 env PYTHONPATH=/tmp/old python3 scaling.py --decode pil --batches 15 &&
            step 110 python3 scaling.py --batches 15) ;;
    manycore) (cd benchmarks && step 60 python3 manycore.py --workers 16 --sleep-ms 3 --batch 64) ;;
    neighbour) (cd benchmarks && step 80 python3 neighbour.py --device cuda --workers 2 8 --batches 60) ;;
    collate)
        (cd benchmarks && step 120 python3 user_collate.py --batch 128 --only torch defaults threads &&
            step 120 env PYTHONPATH=/tmp/old python3 user_collate.py --batch 128 --only torch defaults threads) ;;
    esac
done
