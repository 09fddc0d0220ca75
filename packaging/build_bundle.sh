#!/usr/bin/env bash
# Build the desktop bundle: dist/voxshard/ (the frozen window) and, beside it,
# dist/voxshard-linux.tar.gz with the desktop entry, icon and an installer.
#
#   bash packaging/build_bundle.sh            # uses ./.venv (made by setup_venv.sh)
#
# Then check it starts:   QT_QPA_PLATFORM=offscreen dist/voxshard/voxshard --smoke-test
# The engine (training, speech) is not frozen: install Voxshard with pip (or use
# packaging/setup_venv.sh) so `voxshard-engine` is on PATH, or set VOXSHARD_ENGINE.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-./.venv/bin/python}
if ! "$PY" -c "import PyInstaller" 2>/dev/null; then
    "$PY" -m pip install --quiet "pyinstaller>=6.10"
fi
"$PY" -m PyInstaller --noconfirm --clean --distpath dist --workpath build/pyinstaller \
    packaging/voxshard.spec

# icon and desktop entry inside the bundle, plus a per-user installer
mkdir -p dist/voxshard/share
cp assets/icons/voxshard.svg dist/voxshard/share/voxshard.svg
cp packaging/voxshard.desktop dist/voxshard/share/voxshard.desktop
cat > dist/voxshard/install.sh <<'INSTALL'
#!/usr/bin/env bash
# Install this bundle for the current user: launcher, menu entry and icon.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="${XDG_BIN_HOME:-$HOME/.local/bin}"
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
mkdir -p "$BIN" "$DATA/applications" "$DATA/icons/hicolor/scalable/apps"
ln -sf "$HERE/voxshard" "$BIN/voxshard"
cp "$HERE/share/voxshard.svg" "$DATA/icons/hicolor/scalable/apps/voxshard.svg"
sed "s|^Exec=voxshard|Exec=$HERE/voxshard|; s|^TryExec=voxshard|TryExec=$HERE/voxshard|" \
    "$HERE/share/voxshard.desktop" > "$DATA/applications/voxshard.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database "$DATA/applications" || true
echo "Installed: $BIN/voxshard and the Voxshard menu entry."
INSTALL
chmod +x dist/voxshard/install.sh

QT_QPA_PLATFORM=offscreen dist/voxshard/voxshard --smoke-test

# size budget: the bundle freezes only the window; anything big is an engine library
# that slipped in (exclude it in packaging/voxshard.spec)
BUDGET_MB=${VOXSHARD_BUNDLE_BUDGET_MB:-300}
size_mb=$(du -sm dist/voxshard | cut -f1)
echo "Bundle size: ${size_mb} MB (budget ${BUDGET_MB} MB). Largest parts:"
du -sm dist/voxshard/_internal/* 2>/dev/null | sort -rn | head -12 \
    | awk '{ printf "  %6d MB  %s\n", $1, $2 }'
if [ "$size_mb" -gt "$BUDGET_MB" ]; then
    echo "The bundle is ${size_mb} MB, over its ${BUDGET_MB} MB budget: exclude the large" \
         "packages above that the window does not use in packaging/voxshard.spec." >&2
    exit 1
fi
tar -C dist -czf dist/voxshard-linux.tar.gz voxshard
echo "Bundle: dist/voxshard/ and dist/voxshard-linux.tar.gz"
