# Call 4 (tools/device/prepare.sh), right after run3.sh on the same warm machine: entmax
# adapter settings compared on held-out TRAIN passages, one process per setting on the GPU
# (tools/device/adapt_sweep.py; .gpu/adapt/data.json is written by its --write-data here).
cd "$(dirname "$0")/../.."
. .gpu/common/setup.sh
[ -f /root/partA.bin ] || { echo "NO PART A: a fresh machine"; exit 3; }
[ "$(sha256sum $MODEL | cut -c1-64)" = "$(cat .gpu/common/model.sha256)" ] || { echo "no model: run run2.sh first"; exit 4; }
echo "== sweep $(date +%T)"
for name in ${SWEEP:-$(python3 .gpu/common/adapt_sweep.py --data - --names)}; do
  timeout ${T_SWEEP:-420} python3 .gpu/common/adapt_sweep.py --data .gpu/adapt/data.json --only $name \
    --out $OUT/sweep --device cuda > $OUT/$name.log 2>&1 &
done
wait
grep -h '^{' $OUT/*.log | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); h=r['held_out']; n=r['held_out_news']
    print(r['name'], 'held-out', h['mean_cosine'], h['min_cosine'], h['gold_sparsity'], 'news', n['mean_cosine'], 'train_s', r['train_seconds'], 'curve', r['curve'])"
for f in $OUT/*.log; do grep -q '^{' $f || { echo "== $f"; tail -5 $f; }; done
rm -rf $OUT/sweep/*/adapt-checkpoint.pt
echo "== done $(date +%T)"
