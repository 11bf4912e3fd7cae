# Call 1 (tools/device/prepare.sh): keep the first half of the default model's weights for
# call 2 on the same warm machine; the versions there; a quick cuda test.
cd "$(dirname "$0")/../.."
. .gpu/common/setup.sh
cp .gpu/a/partA /root/partA.bin && ls -la /root/partA.bin
nvidia-smi -L
python3 -c "import torch,transformers,numba;print('torch',torch.__version__,torch.cuda.get_device_name(0),'transformers',transformers.__version__,'numba',numba.__version__)"
timeout 60 python3 -m pytest -m cuda -p no:cacheprovider -q -rs tests/attention/test_entmax_ops.py 2>&1 | tail -5
echo "== done $(date +%T)"
