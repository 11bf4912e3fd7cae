# Call 2 (tools/device/prepare.sh): the default model whole again (sha256 checked); the cuda
# tests, extract.py, restricted.py and gpu_solver.py on CUDA, the Dockerfile's install step.
cd "$(dirname "$0")/../.."
. .gpu/common/setup.sh
[ -f /root/partA.bin ] || { echo "NO PART A: a fresh machine"; exit 3; }
cat /root/partA.bin .gpu/b/partB > $MODEL
[ "$(sha256sum $MODEL | cut -c1-64)" = "$(cat .gpu/common/model.sha256)" ] || { echo "weights differ from the packaged file"; exit 4; }
echo "== cuda tests $(date +%T)"
timeout ${T_TESTS:-200} python3 -m pytest -m cuda -p no:cacheprovider -q -rs \
  tests/attention/test_block_sparse.py tests/attention/test_entmax_ops.py tests/attention/test_gold_edges.py \
  tests/predictors/test_block_keys.py tests/predictors/test_row_fraction.py tests/projections/test_heads.py tests/test_distributed_backend.py \
  tests/commands/test_adapt.py 2>&1 | tee $OUT/cuda_tests.log | tail -30
echo "== extract.py $(date +%T)"
timeout ${T_EXTRACT:-110} python3 benchmarks/extract.py 2>&1 | grep -v "Loading weights" | tee $OUT/extract.log
echo "== restricted.py cuda $(date +%T)"
timeout ${T_RESTR:-200} python3 benchmarks/restricted.py --device cuda --no-quality --repeats 5 --sizes 1024 4096 8192 2>&1 | grep -v "Loading weights" | tee $OUT/restricted_cuda.log
echo "== gpu_solver.py $(date +%T)"
timeout 120 python3 benchmarks/gpu_solver.py 2>&1 | grep -v "Loading weights" | tee $OUT/gpu_solver.log
echo "== docker install step $(date +%T)"
timeout 90 python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target /tmp/pkg . 2>&1 | tail -3
R=$PWD; (cd /tmp && PYTHONPATH=/tmp/pkg:$S timeout 60 python3 $R/.gpu/common/docker_check.py) 2>&1 | grep -v "Loading weights" | tee $OUT/docker.log
echo "== done $(date +%T)"
