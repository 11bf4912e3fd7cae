# Call 5 (tools/device/prepare.sh), after run2.sh on the same warm machine (the default
# model's weights re-joined there): long-context attention against AdaSplash in one process
# (benchmarks/gpu_attention.py: SDPA, dense entmax, AdaSplash, block Sparsefinder plain, exact
# and as one Triton kernel), random and the default model's q/k, fp32 and fp16.
cd "$(dirname "$0")/../.."
. .gpu/common/setup.sh
[ -f /root/partA.bin ] || { echo "NO PART A: a fresh machine"; exit 3; }
W=$(ls .gpu/common/adasplash-*.whl 2>/dev/null | head -1)
[ -n "$W" ] && python3 -m pip install -q --no-deps --target /tmp/ada "$W" && export PYTHONPATH=$PYTHONPATH:/tmp/ada
python3 -c "import triton, torch; print('triton', triton.__version__, torch.cuda.get_device_name(0))"
echo "== gpu_attention $(date +%T)"
timeout ${T_ATT:-540} python3 benchmarks/gpu_attention.py --device cuda \
  --sizes ${SIZES:-4096 8192 16384 32768} --dtypes fp32 fp16 --inputs random default \
  2>&1 | grep -v "Loading weights" | tee $OUT/gpu_attention.log
echo "== done $(date +%T)"
