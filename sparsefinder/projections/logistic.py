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

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn.functional import logsigmoid

from sparsefinder.data.records import AttentionRecord
from sparsefinder.projections.heads import HeadProjections
from sparsefinder.projections.hinge import (
    _INIT_SAMPLE,
    _check_hyperparameters,
    _discriminative_init,
    loss_metadata,
)
from sparsefinder.projections.pairs import PairsObjective, _check_records, _LayerPairs
from sparsefinder.training import EarlyStop, LayerLog, Trainer


def _initial_bias(pairs: _LayerPairs, weight: Tensor, ids: Tensor, neg_rows: Tensor) -> Tensor:
    """Midpoint of the mean positive and negative squared distances, per head → (heads,)."""
    dp, dn = pairs.first_negative_differences(ids, neg_rows)
    wt = weight.transpose(-1, -2)
    return (torch.bmm(dp, wt).square().sum(-1).mean(-1)
            + torch.bmm(dn, wt).square().sum(-1).mean(-1)) / 2


def logistic_gradients(
    pairs: _LayerPairs, q_rows: Tensor, k_rows: Tensor, n_rows: Tensor, weight: Tensor,
    bias: Tensor,
) -> tuple[list[Tensor], Tensor]:
    """Gradients ``[∂/∂W, ∂/∂b]`` of the mean loss on a batch of (heads, B) positives and
    (heads, B, num) negatives, and that loss (0-dim).

    Gradients are written out (as in the hinge's step): with ``Δ = q − k`` and ``z = b −
    ‖WΔ‖²``, ``∂z/∂W = −2 (WΔ) Δᵀ`` and ``∂z/∂b = 1``; the loss derivative is ``σ(z) − 1``
    for a positive and ``σ(z)`` for a negative.
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
    return [grad_w, g_pos.sum(-1) + g_neg.sum(-1)], loss.mean()


def logistic_step(
    pairs: _LayerPairs, q_rows: Tensor, k_rows: Tensor, n_rows: Tensor, weight: Tensor,
    bias: Tensor, optimizer: torch.optim.Optimizer,
) -> Tensor:
    """One optimizer step on a batch (:func:`logistic_gradients`); returns the mean loss."""
    (weight.grad, bias.grad), loss = logistic_gradients(pairs, q_rows, k_rows, n_rows, weight,
                                                        bias)
    optimizer.step()
    return loss


class LogisticObjective(PairsObjective):
    """The pointwise logistic loss on the layer pairs: parameters ``[W, b]``."""

    def __init__(self, records: Sequence[AttentionRecord], *, rank: int, **data: Any) -> None:
        super().__init__(records, **data)
        self.rank = rank

    def init(self) -> list[Tensor]:
        sample = self.ids[:, : min(_INIT_SAMPLE, self.ids.shape[1])]
        weight = _discriminative_init(self.drawn, self.neg_rows, sample, self.rank, 1.0)
        return [weight, _initial_bias(self.drawn, weight.contiguous(), sample, self.neg_rows)]

    def batch_gradients(self, params: list[Tensor], pairs: _LayerPairs, q_rows: Tensor,
                        k_rows: Tensor, n_rows: Tensor) -> tuple[list[Tensor], Tensor]:
        return logistic_gradients(pairs, q_rows, k_rows, n_rows, *params)

    def finish(self, params: list[Tensor] | None, log: LayerLog) -> dict[str, Any]:
        if params is None:  # a softmax layer: zero maps keep every key
            params = [torch.zeros(self.heads, self.rank, self.records[0].layers[
                self.layer].queries.shape[-1]), torch.zeros(self.heads)]
        w, bias = (p.detach().cpu() for p in params)
        tokens = torch.cat([r.layers[self.layer].queries for r in self.records + self.held]
                           + [r.layers[self.layer].keys for r in self.records + self.held],
                           dim=1).float()
        return {"weight": w, "bias": -(w @ tokens.mean(1)[..., None])[..., 0],  # centring
                "logistic_bias": [round(float(x), 6) for x in bias], "log": log}


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
    device: torch.device | str = "cpu",
    early_stop: EarlyStop | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
) -> HeadProjections:
    """Shared projections of every head trained with the pointwise logistic loss (see module).

    Same data pipeline, batching, determinism and loop options (``device``, ``early_stop``,
    ``checkpoint``, ``resume``) as ``train_projections``; ``metadata`` holds
    ``loss_first``/``loss_last`` per layer and the learned ``logistic_bias``.
    """
    _check_hyperparameters(
        rank=rank, margin=1.0, lr=lr, epochs=epochs, batch_size=batch_size,
        negatives_per_positive=negatives_per_positive, seed=seed, init="discriminative",
    )
    layers, heads, _d = _check_records(records, rank)
    fit, held = early_stop.split(records) if early_stop is not None else (records, [])
    objective = LogisticObjective(fit, held_out=held, heads=heads, batch_size=batch_size,
                                  negatives_per_positive=negatives_per_positive, seed=seed,
                                  rank=rank)
    trainer = Trainer(epochs=epochs, lr=lr, device=device, progress=progress,
                      desc="projections (logistic)", early_stop=early_stop,
                      checkpoint=checkpoint)
    done = trainer.fit(objective, layers, resume=resume)
    metadata = {
        "objective": "logistic", "rank": rank, "lr": float(lr), "epochs": epochs,
        "batch_size": batch_size, "negatives_per_positive": negatives_per_positive,
        "seed": seed, "init": "discriminative", "n_records": len(records),
        **loss_metadata([layer["log"] for layer in done]),
        "logistic_bias": [layer["logistic_bias"] for layer in done],
    }
    return HeadProjections(
        weight=torch.stack([layer["weight"] for layer in done]),
        bias=torch.stack([layer["bias"] for layer in done]), model_id=model_id,
        alpha=float(alpha), metadata=metadata,
    )
