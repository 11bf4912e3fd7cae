"""How the block projections' settings were chosen, on the TRAIN split only (issue 13).

1. Rank and epochs per block size (``block_projections.DEFAULT_RANK``/``EPOCHS_BY_BLOCK``):
   every 5th TRAIN text held out, the others fit r ∈ {4, 8} × epochs ∈ {1, 10, 30, 100};
   criterion: held-out block recall of ``block-learned`` averaged over 1 and 2 key blocks.
2. The key-block selector of ``benchmarks/restricted.py`` (``--selector auto``): edge recall
   and exact rows of its setting on TRAIN-split q/k at n = 4096, layers 1-4, key blocks from
   pooled token projections vs learned block projections.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python tools/choose_block_projections.py

A few minutes on two cores. The validation split is never read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def rank_and_epochs() -> None:
    from sparsefinder.data.corpus import corpus_texts
    from sparsefinder.data.records import extract
    from sparsefinder.evaluation.sweep import score_specs
    from sparsefinder.methods.spec import PredictorSpec
    from sparsefinder.models.loading import load_model
    from sparsefinder.projections.blocks import LEARNED_BLOCKS, train_block_projections

    loaded = load_model("default")
    texts = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length, None)
    records = extract(loaded, texts, batch_size=8)
    fit = [r for i, r in enumerate(records) if i % 5]
    held = [r for i, r in enumerate(records) if i % 5 == 0]
    for block in LEARNED_BLOCKS:
        specs = [PredictorSpec.of("block-learned", {"block": block, "n_blocks": b})
                 for b in (1, 2)]
        for rank in (4, 8):
            for epochs in (1, 10, 30, 100):
                projections = train_block_projections(fit, block=block, rank=rank,
                                                      epochs=epochs)
                scores, _ = score_specs(held, None, specs, fitted=[projections] * 2)
                mean = sum(s.block_recall for s in scores) / len(scores)
                print(f"block {block} r={rank} epochs={epochs}: held-out block recall "
                      f"{mean:.4f} (" + ", ".join(f"{s.block_recall:.4f}" for s in scores)
                      + " at 1, 2 key blocks)", flush=True)


def selector() -> None:
    import restricted

    for layer in (1, 2, 3, 4):
        q, k, source = restricted.real_qk(layer, 4096, "train")
        for name in ("pooled", "learned"):
            args = argparse.Namespace(block=32, n_blocks=4, n_keys=256, selector=name)
            recall, exact, _ = restricted.quality(q, k, layer, args)
            print(f"layer {layer} ({source}) {name}: edge recall {recall:.4f}, exact rows "
                  f"{exact:.4f}", flush=True)


if __name__ == "__main__":
    rank_and_epochs()
    selector()
