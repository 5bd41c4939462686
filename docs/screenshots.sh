#!/usr/bin/env bash
# Headless screenshots of the built site, as a reader sees it: the index, one gallery page and
# one API page, into docs/_build/screenshots/. Build the site first:
#     sphinx-build -W -b html docs docs/_build/html
# Needs Debian's chromium (apt-get install -y chromium). Usage: docs/screenshots.sh [WIDTH]
set -euo pipefail
cd "$(dirname "$0")/.."
html="$PWD/docs/_build/html"
out="$PWD/docs/_build/screenshots"
width="${1:-1280}"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then
    echo "screenshots.sh: no chromium found (apt-get install -y chromium)" >&2
    exit 2
fi
if [[ ! -f "$html/index.html" ]]; then
    echo "screenshots.sh: $html/index.html missing; build the docs first" >&2
    exit 2
fi
mkdir -p "$out"
# page path (relative to the html root), output name, window height in pixels
shots=(
    "index.html index 1400"
    "auto_examples/plot_figure2_invariant_attention.html gallery_figure2 2600"
    "auto_examples/index.html gallery_index 1100"
    "generated/invariant_cluster.InvariantAttentionClusterer.html api_clusterer 2200"
    "api.html api_index 1400"
)
for shot in "${shots[@]}"; do
    read -r page name height <<<"$shot"
    # --no-sandbox: CI containers run as root; the pages are local files we just built
    "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --window-size="$width,$height" --screenshot="$out/$name.png" \
        "file://$html/$page" >/dev/null 2>&1
    echo "$out/$name.png"
done
