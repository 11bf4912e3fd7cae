"""Projections trained with a pointwise logistic loss and a per-head bias (objective "logistic").

Why: the paper's hinge (Eq. 7) only ranks a row's positive above a negative of the SAME row,
while the distance predictor then applies one threshold per head to every pair of every
row. This objective trains exactly that decision rule: for a pair ``(q, k)`` of head ``h``
the logit is

    z = b_h − ‖W_h (q − k)‖² ,

so ``z > 0`` ⇔ ``‖q' − k'‖ < √b_h``, and the loss is the binary cross-entropy of gold edges
(label 1) against uniformly drawn non-edges of the same rows (label 0), one negative per
positive by default, each class averaged separately so both weigh the same. ``W_h`` (same
shape and map as the paper's projections: queries and keys share it) and ``b_h`` are learned
together with Adam; the start is the paper's discriminative initialisation and ``b_h`` the
midpoint of the mean positive and negative squared distances there. The data pipeline
(positives, negative sampling, schedule) is the one of
:func:`sparsefinder.projections.hinge.train_projections`.

The learned ``b_h`` is stored in ``metadata["logistic_bias"]`` (layers × heads): ``√b_h`` is
the distance threshold the loss was trained for; calibrated predictors
(:mod:`sparsefinder.calibration.estimators`) choose their own thresholds on the train split.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.functional import logsigmoid
from tqdm.auto import tqdm

from sparsefinder.data.records import AttentionRecord
from sparsefinder.projections.heads import HeadProjections
from sparsefinder.projections.hinge import (
    _INIT_SAMPLE,
    _check_hyperparameters,
    _discriminative_init,
)
from sparsefinder.projections.pairs import (
    _check_records,
    _layer_pairs,
    _LayerPairs,
    _schedule,
    sample_negatives,
)


def _initial_bias(pairs: _LayerPairs, weight: Tensor, ids: Tensor, neg_rows: Tensor) -> Tensor:
    """Midpoint of the mean positive and negative squared distances, per head → (heads,)."""
    dp, dn = pairs.first_negative_differences(ids, neg_rows)
    wt = weight.transpose(-1, -2)
    return (torch.bmm(dp, wt).square().sum(-1).mean(-1)
            + torch.bmm(dn, wt).square().sum(-1).mean(-1)) / 2


def logistic_step(
    pairs: _LayerPairs, q_rows: Tensor, k_rows: Tensor, n_rows: Tensor, weight: Tensor,
    bias: Tensor, optimizer: torch.optim.Optimizer,
) -> Tensor:
    """One Adam step on a batch of (heads, B) positives and (heads, B, num) negatives.

    Gradients are written out (as in the hinge's step): with ``Δ = q − k`` and ``z = b −
    ‖WΔ‖²``, ``∂z/∂W = −2 (WΔ) Δᵀ`` and ``∂z/∂b = 1``; the loss derivative is ``σ(z) − 1``
    for a positive and ``σ(z)`` for a negative. Returns the mean loss (0-dim).
    """
    _, size, num = n_rows.shape
    diff_pos, diff_neg = pairs.batch_differences(q_rows, k_rows, n_rows)
    wt = weight.transpose(-1, -2)
    z_pos_vec = torch.bmm(diff_pos, wt)  # (heads, B, r)
    z_neg_vec = torch.bmm(diff_neg, wt)  # (heads, B·num, r)
    z_pos = bias[:, None] - z_pos_vec.square().sum(-1)
    z_neg = bias[:, None] - z_neg_vec.square().sum(-1)
    loss = -(logsigmoid(z_pos).mean(-1) + logsigmoid(-z_neg).mean(-1))  # (heads,)
    g_pos = (torch.sigmoid(z_pos) - 1.0) / size  # ∂loss/∂z_pos, (heads, B)
    g_neg = torch.sigmoid(z_neg) / (size * num)
    grad_w = -2.0 * (
        torch.bmm((z_pos_vec * g_pos[..., None]).transpose(1, 2), diff_pos)
        + torch.bmm((z_neg_vec * g_neg[..., None]).transpose(1, 2), diff_neg)
    )
    weight.grad = grad_w
    bias.grad = g_pos.sum(-1) + g_neg.sum(-1)
    optimizer.step()
    return loss.mean()


def train_logistic(
    records: list[AttentionRecord],
    *,
    rank: int = 4,
    lr: float = 0.01,
    epochs: int = 1,
    batch_size: int = 1024,
    negatives_per_positive: int = 1,
    seed: int = 0,
    progress: bool = False,
    model_id: str = "",
    alpha: float = 1.5,
) -> HeadProjections:
    """Shared projections of every head trained with the pointwise logistic loss (see module).

    Same data pipeline, batching and determinism as ``train_projections``; ``metadata``
    holds ``loss_first``/``loss_last`` per layer and the learned ``logistic_bias``.
    """
    _check_hyperparameters(
        rank=rank, margin=1.0, lr=lr, epochs=epochs, batch_size=batch_size,
        negatives_per_positive=negatives_per_positive, seed=seed, init="discriminative",
    )
    layers, heads, _d = _check_records(records, rank)
    generator = torch.Generator().manual_seed(seed)
    weights, biases, logit_biases, loss_first, loss_last = [], [], [], [], []
    bar = tqdm(total=layers * epochs, desc="projections (logistic)", unit="layer·epoch",
               disable=not progress)
    for layer in range(layers):
        pairs = _layer_pairs(records, layer)
        weight: Tensor | None = None
        bias: Tensor | None = None
        optimizer: torch.optim.Optimizer | None = None
        history: list[Tensor] = []
        for _epoch in range(epochs):
            negs = sample_negatives(pairs.gold_flat, pairs.gold_base, pairs.n_allowed,
                                    negatives_per_positive, generator)
            neg_rows = pairs.k_base[:, None] + negs
            ids, steps = _schedule(pairs, heads, batch_size, generator)
            if weight is None:
                sample = ids[:, : min(_INIT_SAMPLE, ids.shape[1])]
                weight = _discriminative_init(pairs, neg_rows, sample, rank, 1.0).contiguous()
                bias = _initial_bias(pairs, weight, sample, neg_rows).contiguous()
                optimizer = torch.optim.Adam([weight, bias], lr=lr)
            rows = (pairs.q_row[ids], pairs.k_row[ids], neg_rows[ids])
            for step in range(steps):
                cut = slice(step * batch_size, (step + 1) * batch_size)
                history.append(logistic_step(
                    pairs, *(r[:, cut] for r in rows), weight, bias, optimizer
                ))
            bar.update(1)
        losses = torch.stack(history).tolist()
        tail = max(1, len(losses) // 10)
        loss_first.append(sum(losses[:tail]) / tail)
        loss_last.append(sum(losses[-tail:]) / tail)
        w = weight.detach()
        tokens = torch.cat([r.layers[layer].queries for r in records]
                           + [r.layers[layer].keys for r in records], dim=1).float()
        biases.append(-(w @ tokens.mean(1)[..., None])[..., 0])  # centring: no effect on q − k
        weights.append(w)
        logit_biases.append([round(float(x), 6) for x in bias.detach()])
    bar.close()
    metadata = {
        "objective": "logistic", "rank": rank, "lr": float(lr), "epochs": epochs,
        "batch_size": batch_size, "negatives_per_positive": negatives_per_positive,
        "seed": seed, "init": "discriminative", "n_records": len(records),
        "loss_first": loss_first, "loss_last": loss_last, "logistic_bias": logit_biases,
    }
    return HeadProjections(
        weight=torch.stack(weights), bias=torch.stack(biases), model_id=model_id,
        alpha=float(alpha), metadata=metadata,
    )
