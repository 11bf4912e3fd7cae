"""Discriminative refinement of the low-rank projections (objective "lowrank-logistic").

Why: the training-free fit of :mod:`sparsefinder.projections.lowrank` approximates every score
equally
well in the mean-squared sense, while a prediction only needs the ORDER of a head's scores
around its threshold right. Starting from that closed-form fit, we train the same maps
``q̂ = A q + a``, ``k̂ = B k + b`` (row-threshold coordinate included) with the pointwise
logistic loss of :mod:`sparsefinder.projections.logistic` on the bilinear logit

    z = s_h · (q̂·k̂) + c_h ,

gold edges against uniformly drawn non-edges of the same rows (per-head scale ``s_h`` and
bias ``c_h``; the scale is folded into ``A``, ``a`` afterwards, the bias kept in
``metadata["logistic_bias"]``). The augmentation radii are then recomputed on the train
tokens, so the result is again an augmented projections file (same cost, ``r + 3``
coordinates). Measured on the default model, rank 4: recall at sparsity 0.90 rises from
0.75 to 0.79 (``distance:budget``), rank 8 from 0.86 to 0.88, for one epoch (~45 s on one
CPU core).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.nn.functional import logsigmoid

from sparsefinder.data.records import AttentionRecord
from sparsefinder.projections.heads import HeadProjections
from sparsefinder.projections.hinge import _check_hyperparameters, loss_metadata
from sparsefinder.projections.lowrank import fit_lowrank, max_norms
from sparsefinder.projections.pairs import PairsObjective, _LayerPairs
from sparsefinder.training import EarlyStop, LayerLog, Trainer, autograd_gradients

_NAMES = ("weight", "bias", "key_weight", "key_bias")


class BilinearObjective(PairsObjective):
    """The logistic loss of the bilinear logit on the layer pairs: parameters ``[A, a, B, b,
    s, c]`` (maps, biases, per-head scale and shift), started from ``projections``.

    A dense head (every row of every text attends to every key it may see: a barely sparse
    layer, e.g. the last layers of a random BERT) has no non-edge to contrast: it keeps its
    start (its batches are borrowed only so the heads train together, see
    :func:`~sparsefinder.projections.pairs.dense_heads_of`), and a layer of dense heads only
    is not trained at all."""

    def __init__(self, projections: HeadProjections, records: Sequence[AttentionRecord],
                 **data: Any) -> None:
        super().__init__(records, heads=projections.num_heads, **data)
        self.start_from = projections
        self.zero_dense = True

    def init(self) -> list[Tensor]:
        maps = [getattr(self.start_from, name)[self.layer].clone().requires_grad_()
                for name in _NAMES]
        return [*maps, torch.ones(self.heads, requires_grad=True),
                torch.zeros(self.heads, requires_grad=True)]

    def batch_gradients(self, params: list[Tensor], pairs: _LayerPairs, q_rows: Tensor,
                        k_rows: Tensor, n_rows: Tensor) -> tuple[list[Tensor], Tensor]:
        with torch.enable_grad():
            loss = _loss(pairs.q_table[q_rows], pairs.k_table[k_rows], pairs.k_table[n_rows],
                         params[:4], params[4], params[5])
            return autograd_gradients(loss, params)

    def finish(self, params: list[Tensor] | None, log: LayerLog) -> dict[str, Any]:
        start = [*(getattr(self.start_from, name)[self.layer] for name in _NAMES),
                 torch.ones(self.heads), torch.zeros(self.heads)]
        if params is None:  # a softmax or all-dense layer: nothing learned, the start is kept
            params = start
        wq, bq, wk, bk, scale, shift = (p.detach().cpu().clone() for p in params)
        dense = list(self.borrow)
        for learned, first in zip((wq, bq, wk, bk, scale, shift), start, strict=True):
            learned[dense] = first[dense].to(learned.dtype)  # dense heads: their start
        s = scale[:, None]
        wq, bq = wq * s[..., None], bq * s  # fold the scale into the query side
        q_norm, k_norm = max_norms(self.records + self.held, self.layer, wq, bq, wk, bk)
        slack = float(self.start_from.metadata.get("radius_slack", 1.05))
        return {"weight": wq, "bias": bq, "key_weight": wk, "key_bias": bk,
                "query_radius": q_norm * slack, "key_radius": k_norm * slack,
                "logistic_bias": [round(float(x), 6) for x in shift], "dense": dense,
                "log": log}


class MassObjective(BilinearObjective):
    """:class:`BilinearObjective` with each gold edge weighted by its entmax probability
    (objective ``"lowrank-mass"``). Why: the uniform loss counts a key holding 0.001 of a row's
    mass as much as one holding 0.9, while the model's output needs the heavy keys of every
    row; weighting the positive term by ``p_ij`` (normalised over the batch: the loss keeps its
    scale) spends the projections' few coordinates on the edges that carry the mass. The
    non-edges keep their uniform weight (they have no mass to rank by)."""

    #: the row-wise terms added to the pointwise loss (:func:`_loss`'s flags): none here
    row_terms: ClassVar[dict[str, bool]] = {}

    def start(self, layer: int, device: torch.device) -> bool:
        started = super().start(layer, device)
        if started and self.pairs.mass is None:
            raise ValueError("the mass objective needs each gold edge's probability; these "
                             "records hold gold graphs only (extract them with probabilities)")
        return started

    def gradients(self, params: list[Tensor], step: int) -> tuple[list[Tensor], Tensor]:
        cut = slice(step * self.batch_size, (step + 1) * self.batch_size)
        self.weights = None if self.mass_rows is None else self.mass_rows[:, cut]
        return super().gradients(params, step)

    def held_out_loss(self, params: list[Tensor]) -> Tensor:
        self.weights = self.held_mass
        return super().held_out_loss(params)

    def batch_gradients(self, params: list[Tensor], pairs: _LayerPairs, q_rows: Tensor,
                        k_rows: Tensor, n_rows: Tensor) -> tuple[list[Tensor], Tensor]:
        with torch.enable_grad():
            loss = _loss(pairs.q_table[q_rows], pairs.k_table[k_rows], pairs.k_table[n_rows],
                         params[:4], params[4], params[5], weights=self.weights,
                         **self.row_terms)
            return autograd_gradients(loss, params)


class PairwiseMassObjective(MassObjective):
    """:class:`MassObjective` plus a mass-weighted pairwise term (objective
    ``"lowrank-pairwise"``): each gold edge's logit against its row's drawn non-edges,
    ``−log σ(z_pos − z_neg)``, weighted by the edge's probability. Why: the pointwise terms
    place each logit against one threshold shared by every row of a head; the pairwise term
    asks only that a row's heavy keys come ahead of that row's others, which is what a row's
    floor and top keys read. The pointwise terms stay, so a shared threshold still works."""

    row_terms: ClassVar[dict[str, bool]] = {"pairwise": True}


#: The most optimizer steps of one layer's epoch. Why: an epoch has ``ceil(max_h P_h / batch)``
#: steps, which grows with the corpus and a layer's density (~n² gold edges a text when nearly
#: dense); a head with more positives trains on a uniform sample of them
#: (:func:`~sparsefinder.projections.pairs.subsample_pairs`). 1024 is above the bundled model's
#: largest epoch (956 steps, layer 5, default corpus), so its training is unchanged (nothing is
#: drawn where the bound does not bind); see docs/results/speed.md.
MAX_STEPS = 1024


class ListwiseMassObjective(MassObjective):
    """:class:`MassObjective` plus a listwise term (objective ``"lowrank-listwise"``): the
    cross-entropy of the gold entmax distribution against a softmax over each row's logits
    (−d²/2 in the augmented space, up to the row's own constant), sampled: each gold edge
    ``(i, j)`` against its row's drawn non-edges, ``−p_ij · log softmax(z_ij, z_ij')_j``.
    Why: the row's softmax asks that the keys carrying the mass come first within the row,
    in proportion to that mass, and does not move with the shared shift; the pointwise terms
    stay, so one threshold per head still works."""

    row_terms: ClassVar[dict[str, bool]] = {"listwise": True}


#: The refinement's weighting of the gold edges, by objective name.
WEIGHTINGS = {"uniform": BilinearObjective, "mass": MassObjective,
              "pairwise": PairwiseMassObjective, "listwise": ListwiseMassObjective}


def refine_lowrank(
    projections: HeadProjections,
    records: Sequence[AttentionRecord],
    *,
    lr: float = 3e-3,
    epochs: int = 1,
    batch_size: int = 1024,
    negatives_per_positive: int = 1,
    seed: int = 0,
    progress: bool = False,
    device: torch.device | str = "cpu",
    early_stop: EarlyStop | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
    weighting: str = "uniform",
    max_steps: int | None = MAX_STEPS,
) -> HeadProjections:
    """A refined copy of augmented (``lowrank``) projections, trained on TRAIN records
    (loop options as in :func:`~sparsefinder.projections.hinge.train_projections`);
    ``weighting="mass"``: each gold edge weighted by its entmax probability
    (:class:`MassObjective`); ``max_steps``: the most optimizer steps of a layer's epoch
    (None: no bound; see :data:`MAX_STEPS`)."""
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                  or max_steps < 1):
        raise ValueError(f"max_steps must be an integer >= 1 or None, got {max_steps!r}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    if projections.kind != "augmented":
        raise ValueError("refine_lowrank needs augmented projections from fit_lowrank()")
    _check_hyperparameters(
        rank=projections.rank, margin=1.0, lr=lr, epochs=epochs, batch_size=batch_size,
        negatives_per_positive=negatives_per_positive, seed=seed, init="discriminative",
    )
    for record in records:
        projections.check_record(record)
    fit, held = early_stop.split(records) if early_stop is not None else (records, [])
    objective = WEIGHTINGS[weighting](projections, fit, held_out=held, batch_size=batch_size,
                                      negatives_per_positive=negatives_per_positive, seed=seed,
                                      max_steps=max_steps)
    trainer = Trainer(epochs=epochs, lr=lr, device=device, progress=progress,
                      desc="refine (logistic)", early_stop=early_stop, checkpoint=checkpoint)
    done = trainer.fit(objective, projections.num_layers, resume=resume)
    out = {name: torch.stack([layer[name] for layer in done]).to(
        getattr(projections, name).dtype) for name in (*_NAMES, "query_radius", "key_radius")}
    metadata = {
        **projections.metadata,
        "objective": "lowrank-logistic" if weighting == "uniform" else f"lowrank-{weighting}",
        "lr": float(lr),
        "epochs": epochs, "batch_size": batch_size,
        "negatives_per_positive": negatives_per_positive, "seed": seed,
        "max_steps": max_steps, "steps": [len(layer["log"].losses) for layer in done],
        **loss_metadata([layer["log"] for layer in done]),
        "logistic_bias": [layer["logistic_bias"] for layer in done],
        "dense_heads": [layer["dense"] for layer in done],
    }
    return HeadProjections(
        weight=out["weight"], bias=out["bias"], model_id=projections.model_id,
        alpha=projections.alpha, metadata=metadata, kind="augmented",
        key_weight=out["key_weight"], key_bias=out["key_bias"],
        query_radius=out["query_radius"], key_radius=out["key_radius"],
    )


def fit_lowrank_mass(records: Sequence[AttentionRecord], **options: Any) -> HeadProjections:
    """Objective ``"lowrank-mass"``: :func:`fit_lowrank_logistic` with each gold edge weighted
    by its entmax probability (:class:`MassObjective`)."""
    return fit_lowrank_logistic(records, weighting="mass", **options)


def fit_lowrank_pairwise(records: Sequence[AttentionRecord], **options: Any) -> HeadProjections:
    """Objective ``"lowrank-pairwise"``: :func:`fit_lowrank_mass` plus the mass-weighted
    pairwise term (:class:`PairwiseMassObjective`)."""
    return fit_lowrank_logistic(records, weighting="pairwise", **options)


def fit_lowrank_listwise(records: Sequence[AttentionRecord], **options: Any) -> HeadProjections:
    """Objective ``"lowrank-listwise"``: :func:`fit_lowrank_mass` plus the sampled listwise
    term (:class:`ListwiseMassObjective`)."""
    return fit_lowrank_logistic(records, weighting="listwise", **options)


def fit_lowrank_logistic(records: Sequence[AttentionRecord], *, rank: int = 8,
                         row_threshold: bool = True, radius_slack: float = 1.05,
                         model_id: str = "", alpha: float = 1.5, **refine: Any
                         ) -> HeadProjections:
    """Objective ``"lowrank-logistic"``: :func:`~sparsefinder.projections.lowrank.fit_lowrank`,
    then :func:`refine_lowrank` (``refine``: its keyword arguments: lr, epochs, …)."""
    start = fit_lowrank(records, rank=rank, row_threshold=row_threshold,
                        radius_slack=radius_slack, model_id=model_id, alpha=alpha)
    return refine_lowrank(start, records, **refine)


def _loss(q: Tensor, k_pos: Tensor, k_neg: Tensor, params: list[Tensor], scale: Tensor,
          shift: Tensor, weights: Tensor | None = None, pairwise: bool = False,
          listwise: bool = False) -> Tensor:
    """Mean over heads of the class-balanced logistic loss; q, k_pos (heads, B, d), k_neg
    (heads, B, num, d); ``weights`` (heads, B): the positives' weights (None: uniform), the
    positive term their weighted mean. ``pairwise``: plus ``−log σ(z_pos − z_neg)`` over each
    positive's own negatives, weighted the same; ``listwise``: plus
    ``−log softmax(z_pos, z_neg…)_pos``, weighted the same."""
    wq, bq, wk, bk = params
    heads, size, num, d = k_neg.shape
    q_hat = torch.baddbmm(bq[:, None], q, wq.transpose(1, 2))  # (heads, B, r)
    kp_hat = torch.baddbmm(bk[:, None], k_pos, wk.transpose(1, 2))
    kn_hat = torch.baddbmm(bk[:, None], k_neg.reshape(heads, size * num, d),
                           wk.transpose(1, 2)).view(heads, size, num, -1)
    z_pos = scale[:, None] * (q_hat * kp_hat).sum(-1) + shift[:, None]
    z_neg = scale[:, None, None] * (q_hat[:, :, None] * kn_hat).sum(-1) + shift[:, None, None]
    w = torch.ones_like(z_pos) if weights is None else weights
    total = w.sum().clamp_min(1e-12)
    loss = -((w * logsigmoid(z_pos)).sum() / total + logsigmoid(-z_neg).mean())
    if pairwise:
        ahead = logsigmoid(z_pos[..., None] - z_neg).mean(-1)  # (heads, B)
        loss = loss - (w * ahead).sum() / total
    if listwise:
        row = torch.cat([z_pos[..., None], z_neg], -1)  # (heads, B, 1 + num)
        first = z_pos - torch.logsumexp(row, -1)  # log softmax of the gold key in its list
        loss = loss - (w * first).sum() / total
    return loss
