#!/usr/bin/env bash
# Sets up everything stager needs on this machine, then runs one thing.
#
#   scripts/bootstrap.sh demo   # set up, then `stager demo`
#   scripts/bootstrap.sh test   # set up, then the whole test suite
#
# Set-up is idempotent: system packages (as root, only those missing), a
# virtual environment in .venv/ at the repository root, and stager installed
# in it (editable) with the mpich wheel, Chainer, torchvision, matplotlib (for
# `stager bench`), Lightning and Accelerate (the stacks the PyTorch front end
# is tested under), DLIO (MLPerf Storage's benchmark engine), MosaicML
# Streaming (`dataset.format: mds`, whose tests write shards with Streaming's
# own writer), MkDocs (the documentation site) and the test tools; for the
# tests, NVIDIA DALI too.
set -euo pipefail

cd "$(dirname "$0")/.."
what="${1:-}"
case "$what" in
  demo|test) ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac

# FUSE runs the emulated slow file system, whose C engine is compiled here
# against libfuse3; Slurm and munge run the sbatch template tests on a real
# single-node cluster; strace counts the calls a staged file costs its source
# (tests/test_source_calls.py); python3-venv makes the venv on a bare Debian.
# Missing ones are installed when we are root, else named.
apt_packages=(fuse3 libfuse3-3 libfuse3-dev pkg-config gcc libc6-dev slurmd slurmctld slurm-client munge strace)
python3 -m venv --help >/dev/null 2>&1 || apt_packages+=(python3-venv)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "bootstrap: please install these system packages first: ${missing[*]}" >&2
    exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  python3 -m venv .venv
fi
# constraints.txt keeps torch, Chainer and numpy 1 installable together; it
# must reach the isolated build of Chainer's sdist too, and that build needs
# the standard library's distutils.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CONSTRAINT="$PWD/constraints.txt"
export PIP_BUILD_CONSTRAINT="$PWD/constraints.txt" SETUPTOOLS_USE_DISTUTILS=stdlib
.venv/bin/python -m pip install -q --upgrade pip "setuptools>=77.0.3,<81" wheel
echo "bootstrap: installing stager and its dependencies into .venv"
extras=mpich,test,chainer,vision,bench,s3,stacks,docs,dlio,mds
# NVIDIA DALI (iterators.dali, the `dali` extra) is for the tests only: the
# demo never needs its 424 MB wheel.
if [ "$what" = test ]; then extras=$extras,dali; fi
.venv/bin/python -m pip install -q -e ".[$extras]"
# A .pth file in the venv's site-packages runs one line at the start of every
# interpreter of this venv. import_hook NAME MODULE CHECK WHY writes NAME.pth,
# which calls MODULE.install(), only where the Python statement CHECK fails
# without it, then checks that CHECK passes with it; elsewhere nothing is
# written. A checkout without MODULE makes the line a no-op.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
import_hook() {
  local name=$1 module=$2 check=$3 why=$4
  rm -f "$site/$name.pth"
  if ! .venv/bin/python -c "$check" >/dev/null 2>&1; then
    echo "bootstrap: $why; adding $site/$name.pth"
    printf 'import sys; exec("try:\\n import %s as m; m.install()\\nexcept Exception: pass")\n' "$module" \
      > "$site/$name.pth"
    .venv/bin/python -c "$check"
  fi
}
# torchvision's PyPI wheel is built for the CUDA torch: beside the CPU-only
# torch its operators cannot load and a plain `import torchvision` (also the
# one inside lightning and torchmetrics) fails. The hook defines the two
# operator schemas that torchvision's import needs, just before its first
# import (iterators/_torchvision_import.py).
import_hook stager-torchvision iterators._torchvision_import 'import torchvision' \
  "torchvision cannot load its operators beside this torch"
# DLIO (the MLPerf Storage benchmark engine) for iterators.dlio: the `dlio`
# extra holds its run-time needs; DLIO itself comes without its declared
# dependencies, which pull TensorFlow, DALI and torchaudio that PyTorch
# workloads never use. Its profiler module still imports TensorFlow at load
# time; the hook answers for that one module (iterators/_dlio_import.py).
.venv/bin/python -m pip install -q --no-deps "dlio-benchmark==2.0.0"
import_hook stager-dlio iterators._dlio_import 'import dlio_benchmark.main' \
  "DLIO's profiler needs TensorFlow, which is not installed"
echo "bootstrap: building the slow file system emulator's C engine"
.venv/bin/stager slowfs build
# An editable install leaves stager's own modules uncompiled; where
# PYTHONDONTWRITEBYTECODE is set (container images often set it), every
# interpreter would compile them again at its start, 0.09 s of CPU a process
# here, paid by each job, rank, worker launcher and group service. Compiled
# once here, as pip does for a package it installs.
echo "bootstrap: compiling stager's modules"
.venv/bin/python -m compileall -q stager iterators >/dev/null

case "$what" in
  demo)
    exec .venv/bin/stager demo
    ;;
  test)
    # The rank-level suite runs inside every rank of a real MPI job: one rank,
    # then four ranks as two emulated nodes. Then the whole suite, which also
    # launches mpiexec jobs of its own. Every MPI job has a time limit.
    py=.venv/bin/python
    mpi=.venv/bin/mpiexec
    args=(-m pytest -p no:cacheprovider -q tests/mpi)
    echo "bootstrap: tests/mpi under mpiexec -n 1"
    timeout 600 "$mpi" -n 1 "$py" "${args[@]}"
    echo "bootstrap: tests/mpi under mpiexec -n 4 (2 emulated nodes of 2 ranks)"
    timeout 600 "$mpi" -n 2 -env STAGER_NODE_ID node-a "$py" "${args[@]}" \
                     : -n 2 -env STAGER_NODE_ID node-b "$py" "${args[@]}"
    echo "bootstrap: the whole test suite"
    exec "$py" -m pytest -p no:cacheprovider tests
    ;;
esac
