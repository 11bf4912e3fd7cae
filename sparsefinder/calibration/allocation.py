"""Sharing a sparsity budget across heads: each head's setting from a Lagrange multiplier.

Maximise the mean recall over heads subject to the mean density being ``1 − s`` (or minimise
the mean density subject to the mean recall being ``ρ``): with a multiplier ``λ`` each head
independently takes the candidate maximising ``recall_h − λ·density_h``, and ``λ`` is found by
bisection. Dense heads (many gold edges) get lower sparsity, sparse heads higher.
"""

from __future__ import annotations

import torch
from torch import Tensor

ALLOCATIONS = ("equal", "budget")


_BUDGET_GRID = 512  # candidate thresholds per head (pair-distance quantiles)


_BISECTION_STEPS = 60


def allocate(
    density: Tensor, recall: Tensor, target_sparsity: float | None, target_recall: float | None
) -> Tensor:
    """Budget allocation over heads: index (layers, heads, 1) of the chosen candidate.

    ``density``/``recall`` (layers, heads, G) of G candidates per head. For a sparsity target
    maximises the mean recall at mean density ``1 − target``; for a recall target minimises
    the mean density at mean recall ``target`` (Lagrangian relaxation, λ by bisection).
    """
    want_sparsity = target_sparsity is not None
    table = density if want_sparsity else recall
    goal = 1.0 - target_sparsity if want_sparsity else target_recall

    def choose(lam: float) -> Tensor:
        return (recall - lam * density).argmax(-1, keepdim=True)

    def value(lam: float) -> float:
        return float(table.gather(-1, choose(lam)).mean())

    low, high = 0.0, 1.0  # λ; a larger λ gives sparser, lower-recall choices
    while value(high) > goal and high < 1e12:
        high *= 4.0
    for _ in range(_BISECTION_STEPS):
        mid = (low + high) / 2
        if value(mid) > goal:
            low = mid
        else:
            high = mid
    # The two sides of the jump in λ differ in a few heads (ties, non-concave curves): start
    # from the side that meets the target (the sparser one for a sparsity target, the one
    # reaching the recall otherwise) and move heads to the other side, best trade first,
    # while the target still holds.
    sparse, dense = choose(high), choose(low)
    start, other = (sparse, dense) if want_sparsity else (dense, sparse)
    choice = start.clone()
    d_gain = (density.gather(-1, other) - density.gather(-1, start)).flatten()
    r_gain = (recall.gather(-1, other) - recall.gather(-1, start)).flatten()
    count = d_gain.numel()
    total = float(table.gather(-1, start).sum())
    moved = (r_gain / d_gain.clamp(min=1e-12)) if want_sparsity else (d_gain / r_gain.clamp(
        max=-1e-12))
    flat = choice.view(-1)
    for index in torch.argsort(moved, descending=True).tolist():
        if bool(start.view(-1)[index] == other.view(-1)[index]):
            continue
        step = float(d_gain[index] if want_sparsity else r_gain[index])
        if (total + step) / count <= goal if want_sparsity else (total + step) / count >= goal:
            flat[index] = other.view(-1)[index]
            total += step
    if want_sparsity:  # a linear stretch (recall ∝ density) jumps as a whole: fill it in
        _fill(choice, density, recall, goal * count - total)
    return choice


def _fill(choice: Tensor, density: Tensor, recall: Tensor, budget: float) -> None:
    """Spend the density left under the target (``budget``, summed over heads) greedily: the
    move of one head to a denser candidate with the largest recall gain that still fits."""
    for _ in range(choice.numel()):
        extra_d = density - density.gather(-1, choice)
        extra_r = recall - recall.gather(-1, choice)
        fits = (extra_d > 0) & (extra_d <= budget + 1e-12)
        gain = torch.where(fits, extra_r, -torch.inf).flatten()
        best = int(gain.argmax())
        if not float(gain[best]) > 0:
            return
        g = density.shape[-1]
        choice.view(-1)[best // g] = best % g
        budget -= float(extra_d.flatten()[best])
