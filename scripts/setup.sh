#!/usr/bin/env bash
# Installs what minato needs on a fresh Debian machine and builds it:
# system packages, a virtualenv in .venv with torch from PyPI, and minato
# itself from this checkout (`pip install .`, through maturin), with
# minato.io.decode_video (the `video` cargo feature, on Debian's FFmpeg).
# Usage: bash scripts/setup.sh [extra]   e.g. `test` for the test tools.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

extra="${1:-}"
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# A C toolchain to link the extension, and venv support for the system Python.
missing=()
command -v cc >/dev/null || missing+=(build-essential)
command -v pkg-config >/dev/null || missing+=(pkg-config)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv python3-dev)
# decode_video: ffmpeg-sys-next finds FFmpeg's libraries with pkg-config and
# generates its bindings with bindgen, which loads libclang and uses clang's
# own headers (both come with `clang`; the 240 MB libclang-dev is not needed,
# nor libavfilter/libavdevice, whose cargo features minato leaves off).
pkg-config --exists libavcodec libavformat libavutil libswscale 2>/dev/null ||
    missing+=(libavcodec-dev libavformat-dev libavutil-dev libswscale-dev)
command -v clang >/dev/null || missing+=(clang)
# The video tests encode their test clips with the ffmpeg command.
if [ "$extra" = test ]; then command -v ffmpeg >/dev/null || missing+=(ffmpeg); fi
if [ "${#missing[@]}" -gt 0 ]; then
    echo "==> apt-get install ${missing[*]}"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

if ! command -v cargo >/dev/null; then
    echo "error: minato builds with Rust >= 1.80; install a toolchain with rustup first." >&2
    exit 1
fi

if [ ! -x .venv/bin/python ]; then
    echo "==> python3 -m venv .venv"
    python3 -m venv .venv
fi
export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"
echo "==> pip install torch and minato${extra:+ [$extra]}"
python -m pip install -q --upgrade pip
python -m pip install -q "torch>=2.11,<2.16" numpy
# `--features` replaces pyproject.toml's feature list, so `python` is repeated.
MATURIN_PEP517_ARGS="--features python,video" python -m pip install -q ".${extra:+[$extra]}"
# From elsewhere: here, the source folder minato/ would shadow the installed package.
(cd / && python -c 'import minato, torch; from minato import _minato
assert _minato._HAS_VIDEO, "minato was built without decode_video"
print(f"minato {minato.__version__} (with video) on torch {torch.__version__}")')
