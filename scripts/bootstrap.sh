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
# is tested under), MkDocs (the documentation site) and the test tools.
set -euo pipefail

cd "$(dirname "$0")/.."
what="${1:-}"
case "$what" in
  demo|test) ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac

# FUSE runs the emulated slow file system, whose C engine is compiled here
# against libfuse3; Slurm and munge run the sbatch template tests on a real
# single-node cluster; python3-venv makes the venv on a bare Debian. Missing
# ones are installed when we are root, else named.
apt_packages=(fuse3 libfuse3-3 libfuse3-dev pkg-config gcc libc6-dev slurmd slurmctld slurm-client munge)
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
.venv/bin/python -m pip install -q -e ".[mpich,test,chainer,vision,bench,s3,stacks,docs]"
# torchvision's PyPI wheel is built for the CUDA torch: beside the CPU-only
# torch its operators cannot load and a plain `import torchvision` (also the
# one inside lightning and torchmetrics) fails. Only there, a .pth file makes
# every interpreter of this venv define the two operator schemas that
# torchvision's import needs, just before its first import
# (iterators/_torchvision_import.py); a checkout without the hook makes the
# line a no-op. Where torchvision imports, nothing is written.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -f "$site/stager-torchvision.pth"
if ! .venv/bin/python -c 'import torchvision' >/dev/null 2>&1; then
  echo "bootstrap: torchvision cannot load its operators beside this torch; adding $site/stager-torchvision.pth"
  echo 'import sys; exec("try:\n import iterators._torchvision_import as m; m.install()\nexcept Exception: pass")' \
    > "$site/stager-torchvision.pth"
  .venv/bin/python -c 'import torchvision'
fi
echo "bootstrap: building the slow file system emulator's C engine"
.venv/bin/stager slowfs build

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
