#!/usr/bin/env bash
# Installs what the harness needs on a Debian machine: the system libraries for headless
# rendering (EGL, OSMesa), a virtual environment, the CPU build of PyTorch, then the project.
# Usage: scripts/setup.sh [VENV_DIR [EXTRAS]]   (default .venv dev). Safe to run again.
#   scripts/setup.sh .venv-suites suites   the suites' environment (make suites): MuJoCo 3.3.x,
#                                          Meta-World and robosuite, the harness and pytest
set -euo pipefail
venv=${1:-.venv}
extras=${2:-dev}

missing=()
for lib in libEGL.so.1 libOSMesa.so libGL.so.1; do
  ldconfig -p | grep -q "$lib" || missing+=("$lib")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing headless rendering libraries (missing: ${missing[*]})"
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: need root to apt-get install libegl1 libgl1 libosmesa6; run as root or install them" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri \
    libosmesa6 libglu1-mesa >/dev/null
fi

python=python3
command -v python3.11 >/dev/null 2>&1 && python=python3.11
"$python" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"error: Python >= 3.11 is needed, found {sys.version.split()[0]}")
PY
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# The CPU build first: a bare `torch` requirement on an empty venv would pull a multi-GB CUDA build.
"$venv/bin/python" -m pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
"$venv/bin/python" -m pip install -q -e ".[$extras]" 2>&1 | grep -v "^WARNING: Location" || true
if [ "$extras" = suites ]; then
  # robosuite pins mink 0.0.5 (whole-body IK for humanoids, unused here), which asks for
  # numpy < 2, so the resolver settles on numpy 1.26, which pyarrow and the main environment's
  # packages do not run on: NumPy 2 as in the main environment (pip warns about mink).
  "$venv/bin/python" -m pip install -q "numpy>=2,<3" 2>&1 \
    | grep -v -e "^WARNING: Location" -e "mink" -e "dependency conflicts" -e "^ERROR: pip's" || true
fi
"$venv/bin/python" -c "import tasks, torch, mujoco; print('torch', torch.__version__, '| mujoco', mujoco.__version__, '| MUJOCO_GL', __import__('os').environ['MUJOCO_GL'])"
