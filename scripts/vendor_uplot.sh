#!/usr/bin/env bash
# Refresh the vendored uPlot files: scripts/vendor_uplot.sh 1.6.32
# Downloads the npm package into a temporary folder (npm pack, no install),
# copies the IIFE build and the stylesheet with the version in their names, and
# prints the sha256 lines for static/vendor/README.md.
set -euo pipefail
version="${1:?usage: scripts/vendor_uplot.sh VERSION}"
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack "uplot@${version}" >/dev/null && tar xzf "uplot-${version}.tgz")
cp "$tmp/package/dist/uPlot.iife.min.js" "static/vendor/uPlot.iife.min-${version}.js"
cp "$tmp/package/dist/uPlot.min.css" "static/vendor/uPlot.min-${version}.css"
cp "$tmp/package/LICENSE" "static/vendor/uPlot-${version}.LICENSE"
sha256sum "static/vendor/uPlot.iife.min-${version}.js" "static/vendor/uPlot.min-${version}.css"
echo "now update static/vendor/README.md and the two references in templates/sessions/detail.html"
