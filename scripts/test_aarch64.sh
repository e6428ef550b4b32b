#!/usr/bin/env bash
# The onnxruntime plugin's own ops on AArch64, emulated (make test-aarch64): qemu-user runs Debian's arm64 Python
# with the aarch64 wheels of numpy, onnxruntime, onnx and pytest at this venv's versions, and the own ops' library
# is built by the aarch64 cross compiler. The x86 builds skip there (an AArch64 process has no x86 flags), so every
# op test runs on the portable build. Then scripts/aarch64_bundles.py deploys the tiny decoder here in each host
# scheme and checks that each bundle generates the same tokens there and passes its golden check there.
# Results only: emulated time says nothing about an AArch64 CPU's speed.
#
# Needs apt-get (Debian or Ubuntu, root or sudo) the first time: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and
# qemu-user, and arm64 as a foreign architecture in dpkg (so that apt can download arm64 packages); the arm64 Python
# packages are downloaded and unpacked, not installed. Everything else lives under
# $EDGEINFER_CACHE_DIR (default ~/.cache/edgeinfer)/aarch64. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ROOT=${EDGEINFER_CACHE_DIR:-$HOME/.cache/edgeinfer}/aarch64
SYSROOT=$ROOT/sysroot SITE=$ROOT/site
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)

if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  $SUDO apt-get update -q && $SUDO apt-get install -y -q gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
fi
if [ ! -x "$SYSROOT/usr/bin/python3.11" ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64 && $SUDO apt-get update -q
  fi
  mkdir -p "$ROOT/debs" "$SYSROOT/lib"
  (cd "$ROOT/debs" && apt-get download python3.11-minimal:arm64 libpython3.11-minimal:arm64 \
    libpython3.11-stdlib:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libssl3:arm64 libbz2-1.0:arm64 \
    liblzma5:arm64 libsqlite3-0:arm64 libuuid1:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 \
    libcrypt1:arm64)
  for deb in "$ROOT"/debs/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
  cp -an /usr/aarch64-linux-gnu/lib/. "$SYSROOT/lib/aarch64-linux-gnu/"  # libc and libstdc++ of the cross packages
  ln -sf aarch64-linux-gnu/ld-linux-aarch64.so.1 "$SYSROOT/lib/ld-linux-aarch64.so.1"
fi
pins=$("$PY" - <<'EOF'
import importlib.metadata as m
names = ["numpy", "onnxruntime", "onnx", "onnx_ir", "ml_dtypes", "protobuf", "sympy", "mpmath", "pytest", "pluggy",
         "iniconfig", "packaging", "flatbuffers", "typing_extensions", "pydantic", "pydantic_core",
         "typing_inspection", "annotated_types", "pyyaml", "click", "rich", "markdown_it_py", "mdurl", "pygments",
         "tokenizers", "jinja2", "markupsafe"]
print(" ".join(f"{n}=={m.version(n)}" for n in names))
EOF
)
if [ "$(cat "$SITE/.pins" 2>/dev/null)" != "$pins" ]; then
  rm -rf "$SITE"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-deps --target "$SITE" --python-version 3.11 --implementation cp \
    --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux_2_28_aarch64 \
    --only-binary=:all: $pins
  echo "$pins" > "$SITE/.pins"
fi
PYTHONPATH="$SITE:$PWD:$PWD/plugins/onnxruntime" CC=aarch64-linux-gnu-gcc EDGEINFER_CACHE_DIR="$ROOT/cache" \
  qemu-aarch64 -L "$SYSROOT" "$SYSROOT/usr/bin/python3.11" -m pytest -q -p no:cacheprovider \
  plugins/onnxruntime/tests/test_custom_ops.py plugins/onnxruntime/tests/test_attention_op.py "$@"
# the core and the onnxruntime plugin installed (not editable) for the emulated Python: their entry points
rm -rf "$ROOT/ei"
"$PY" -m pip install -q --no-deps --no-build-isolation --target "$ROOT/ei" . ./plugins/onnxruntime
"$PY" scripts/aarch64_bundles.py "$ROOT/bundles" env PYTHONPATH="$ROOT/ei:$SITE" CC=aarch64-linux-gnu-gcc \
  EDGEINFER_CACHE_DIR="$ROOT/cache" qemu-aarch64 -L "$SYSROOT" "$SYSROOT/usr/bin/python3.11"
