#!/usr/bin/env bash
# Prepare the one-call long-context GPU check (tools/device/run_long.sh) in .gpu/long (ignored):
#   site.tar.xz  the pinned transformers (the model code of the few families the check loads:
#                one call carries at most 64 MiB with the working tree), entmax and AdaSplash;
#   qk_default.pt.xz  the default model's layer-2 q/k over 32 768 tokens of consecutive
#                512-token windows (benchmarks/restricted.py's real_qk), rounded to float16;
#   run_long.sh. Then, on a fresh machine, one call:
#   run(command="bash .gpu/long/run_long.sh", carry=[".gpu/long"], timeout_s=570)
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu/long && mkdir -p .gpu/long
WHL=$(mktemp -d); SITE=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 -d "$WHL" \
  transformers==5.23.0 entmax==1.3 adasplash
for w in "$WHL"/*.whl; do (cd "$SITE" && unzip -q -o "$w"); done
# Other families keep their configurations only (the library imports some, e.g. Gemma 2's).
KEEP="auto bert llama qwen2 mistral gpt2 encoder_decoder"
for d in "$SITE"/transformers/models/*/; do
  case " $KEEP " in *" $(basename "$d") "*) ;;
    *) find "$d" -type f ! -name "__init__.py" ! -name "configuration_*.py" -delete;; esac
done
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
tar cJf .gpu/long/site.tar.xz -C "$SITE" .
rm -rf "$WHL" "$SITE"
.venv/bin/python - <<'PY' 2>&1 | grep -v "Loading weights\|longer than the specified"
import sys, torch
sys.path.insert(0, "benchmarks")
from restricted import real_qk
q, k, source = real_qk(2, 32768)
torch.save({"q": q.half(), "k": k.half()}, ".gpu/long/qk_default.pt")
print("q/k", tuple(q.shape), source)
PY
xz -T2 -6 .gpu/long/qk_default.pt
cp tools/device/run_long.sh .gpu/long/
du -sh .gpu/long/*; du -cb .gpu/long/* | tail -1
