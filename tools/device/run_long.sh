# The long-context GPU check in ONE call on a fresh machine, after tools/device/prepare_long.sh
# here: run(command="bash .gpu/long/run_long.sh", carry=[".gpu/long"], timeout_s=570).
# No model weights travel: the default model's q/k come in .gpu/long, the ~1 B decoder is
# built on the machine with random weights. Writes $OUT/long_context.md: versions, the cuda
# tests' summary, then every table row as it is measured (a step cut by its timeout keeps its
# rows). Timeouts (seconds) and sizes can be changed by environment variables.
cd "$(dirname "$0")/../.."
S=/tmp/longsite; OUT=${OUT:-/tmp/out}; T=$OUT/long_context.md; mkdir -p $S $OUT
[ -f $S/.ok ] || { tar xJf .gpu/long/site.tar.xz -C $S && touch $S/.ok; }
[ -f /tmp/qk_default.pt ] || xz -dc .gpu/long/qk_default.pt.xz > /tmp/qk_default.pt
export PYTHONPATH=$S:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no cuda')" 2>&1 | tee $T
echo "== cuda tests $(date +%T)" | tee -a $T
timeout ${T_TESTS:-80} python3 -m pytest -n 4 -p no:cacheprovider -q -rs -m "(cuda or numerical) and not slow" \
  tests/attention/test_triton_block_sparse.py tests/attention/test_support_bits.py \
  tests/attention/test_support_certificate.py tests/attention/test_triton_support_check.py \
  tests/attention/test_block_sparse.py tests/predictors/test_block_keys.py \
  tests/attention/test_gold_edges.py 2>&1 | tail -12 | tee -a $T
echo "== gpu_attention, bidirectional $(date +%T)" | tee -a $T
timeout ${T_ATT:-190} python3 benchmarks/gpu_attention.py --device ${DEVICE:-cuda} \
  --sizes ${SIZES:-4096 8192 16384 32768} --dtypes fp32 fp16 --inputs default random \
  --qk /tmp/qk_default.pt --repeats 3 --slow-s 8 --table $T --methods sdpa dense-entmax \
  adasplash select block block-exact block-triton block-triton-exact check-triton 2>&1 | tail -2
echo "== decoder supports, ~1 B at ${DEC_TOKENS:-16384} tokens $(date +%T)" | tee -a $T
timeout ${T_DEC:-150} python3 benchmarks/decoder_supports.py --device ${DEVICE:-cuda} ${DEC_ARGS:-} \
  --tokens ${DEC_TOKENS:-16384} --save-qk /tmp/decoder_qk.pt --qk-tokens ${QK_TOKENS:-32768} 2>&1 \
  | grep -v "Loading weights\|Writing model" | tail -4 | tee -a $T
echo "== gpu_attention, causal, the decoder's q/k $(date +%T)" | tee -a $T
[ -f /tmp/decoder_qk.pt ] && timeout ${T_CAUSAL:-90} python3 benchmarks/gpu_attention.py \
  --device ${DEVICE:-cuda} --sizes ${CAUSAL_SIZES:-8192 32768} --dtypes fp16 --inputs decoder \
  --decoder-qk /tmp/decoder_qk.pt --causal --repeats 3 --slow-s 8 --table $T --methods sdpa \
  dense-entmax adasplash select block block-exact block-triton block-triton-exact check-triton 2>&1 \
  | tail -2
echo "== the selector's pooled stage alone (no second stage), for comparison $(date +%T)" | tee -a $T
timeout ${T_ONE:-40} python3 benchmarks/gpu_attention.py --device ${DEVICE:-cuda} \
  --sizes ${ONE_SIZES:-32768} --dtypes fp16 --inputs default --qk /tmp/qk_default.pt \
  --candidates 0 --repeats 3 --slow-s 8 --table $T --methods select block-triton block-triton-exact \
  2>&1 | tail -2
echo "== done $(date +%T)" | tee -a $T
