"""Per-layer sparsity targets for the floored ``distance:budget``, weighed by each layer's harm, on
TRAIN texts only (an experiment; nothing in the library uses it).

``budget`` shares the sparsity budget over heads to maximise the mean recall of gold edges;
every head's recall weighs the same. Here a layer's recall weighs by how much restricting
that layer ALONE hurts the model's output: thresholds fitted on the first ``--fit-passages``
train passages; each layer restricted alone at the target, the others full, on the first
``--probe-texts`` of those passages: ``harm_l = 1 − output cosine``; weights
``w_l = harm_l / mean(harm)``; the same Lagrangian allocation then maximises
``Σ_h w_layer(h) · recall_h`` at the same mean density, so layers that hurt more get denser
thresholds and the others sparser. Both settings are then run, every layer restricted, on the
next ``--select-passages`` train texts (held out from the calibration, still train).

    PYTHONPATH=$PWD .venv/bin/python tools/layer_targets.py --target 0.9
"""

from __future__ import annotations

import argparse

import torch

import sparsefinder.calibration.floor as floor_module
from sparsefinder.attention.masks import layer_allowed
from sparsefinder.calibration.curves import DEFAULT_FLOOR
from sparsefinder.calibration.floor import CalibratedFlooredDistance
from sparsefinder.calibration.samples import DistanceSamples
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract
from sparsefinder.evaluation.accuracy import compare, encode
from sparsefinder.evaluation.restricted import RestrictionStats, predictor_graph
from sparsefinder.models.loading import load_model
from sparsefinder.projections.heads import HeadProjections


class _Full:
    """Every allowed key (the layer runs as in the full model)."""

    honours_window = True

    def predict(self, q, k, *, causal=False, sliding_window=None):
        allowed = layer_allowed(q.shape[1], k.shape[1], causal=causal,
                                sliding_window=sliding_window)
        shape = (q.shape[0], q.shape[1], k.shape[1])
        full = torch.ones(shape, dtype=torch.bool, device=q.device)
        return full if allowed is None else full & allowed.to(q.device)


def weighted_fit(samples: DistanceSamples, target: float, floor: int,
                 weights: torch.Tensor) -> CalibratedFlooredDistance:
    """``budget`` thresholds maximising the ``weights``-weighted mean recall (per layer)."""
    plain = floor_module.allocate

    def allocate(density, recall, target_sparsity, target_recall):
        return plain(density, recall * weights[:, None, None].to(recall), target_sparsity,
                     target_recall)

    floor_module.allocate = allocate
    try:
        return CalibratedFlooredDistance(target, floor, "budget").fit(samples)
    finally:
        floor_module.allocate = plain


def run(loaded, projections, texts, reference, build) -> dict:
    stats = RestrictionStats()
    graph = predictor_graph(build, "projected", projections)
    restricted = encode(loaded.model, loaded.tokenizer, texts, graph_fn=graph,
                        warn_empty=False, stats=stats, max_length=loaded.max_length)
    scores = compare(reference, restricted)
    overall, per_layer = stats.sparsity()
    return {"sparsity": overall, "per_layer": per_layer, **scores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--projections",
                        default="assets/default/projections-r8-lowrank-logistic.pt")
    parser.add_argument("--fit-passages", type=int, default=100)
    parser.add_argument("--probe-texts", type=int, default=40)
    parser.add_argument("--select-passages", type=int, default=40)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--floor", type=int, default=DEFAULT_FLOOR)
    args = parser.parse_args()
    loaded = load_model("default")
    projections = HeadProjections.load(args.projections, expected_model_id=loaded.model_id)
    every = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                         args.fit_passages + args.select_passages)
    fit_texts = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                             args.fit_passages)
    select_texts, probe_texts = every[len(fit_texts):], fit_texts[:args.probe_texts]
    print(f"fit {len(fit_texts)} train texts, probe {len(probe_texts)} of them, "
          f"select {len(select_texts)} train texts; target {args.target}, floor {args.floor}")
    samples = DistanceSamples.from_records(extract(loaded, fit_texts), projections,
                                           row_ranks=True)
    plain = CalibratedFlooredDistance(args.target, args.floor, "budget").fit(samples)
    layers = loaded.num_layers

    reference = encode(loaded.model, loaded.tokenizer, probe_texts,
                       max_length=loaded.max_length)
    harm = []
    for alone in range(layers):
        scores = run(loaded, projections, probe_texts, reference,
                     lambda layer, a=alone: plain.for_layer(layer) if layer == a else _Full())
        harm.append(1.0 - scores["output_cosine"])
        print(f"layer {alone} alone: sparsity {scores['per_layer'][alone]:.4f}, "
              f"output cosine {scores['output_cosine']:.5f}")
    harm_t = torch.tensor(harm, dtype=torch.float64)
    weights = harm_t / harm_t.mean()
    print("weights:", [round(float(w), 3) for w in weights])
    weighted = weighted_fit(samples, args.target, args.floor, weights)

    reference = encode(loaded.model, loaded.tokenizer, select_texts,
                       max_length=loaded.max_length)
    for name, fitted in (("budget", plain), ("budget, layer-weighted", weighted)):
        train = 1.0 - fitted.train_sparsity_.mean(-1)
        scores = run(loaded, projections, select_texts, reference, fitted.for_layer)
        print(f"{name}: train-sample sparsity {1 - float(train.mean()):.4f} "
              f"(per layer {[round(1 - float(d), 3) for d in train]}); in-run sparsity "
              f"{scores['sparsity']:.4f} (per layer "
              f"{[round(float(s), 3) for s in scores['per_layer']]}); output cosine "
              f"{scores['output_cosine']:.4f}, embedding cosine "
              f"{scores['embedding_cosine']:.4f}, retrieval top-1 "
              f"{scores['retrieval_top1']:.3f}")


if __name__ == "__main__":
    main()
