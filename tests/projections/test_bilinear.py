"""The refinement of the low-rank projections: the mass-weighted objective ranks a row's
heavy key ahead of its light one, where the uniform one cannot tell them apart."""

from __future__ import annotations

import pytest
import torch
from cluster_records import cluster_record

from sparsefinder.projections.bilinear import _loss, refine_lowrank
from sparsefinder.projections.lowrank import fit_lowrank
from sparsefinder.projections.objectives import fit_projections

pytestmark = pytest.mark.numerical


def _logits_after_one_step(weights: torch.Tensor | None, pairwise: bool = False,
                           listwise: bool = False) -> tuple[float, float]:
    """One query row with two gold keys mirrored about the query's axis (equal logits, equal
    non-edge): the logits of the (heavy, light) key after one gradient step on the maps."""
    q = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]], dtype=torch.float64)  # (heads, B, d)
    k_pos = torch.tensor([[[0.0, 1.0], [0.0, -1.0]]], dtype=torch.float64)  # heavy, light
    k_neg = torch.tensor([[[[-1.0, 0.0]], [[-1.0, 0.0]]]], dtype=torch.float64)
    maps = [torch.eye(2, dtype=torch.float64)[None].clone().requires_grad_(),
            torch.zeros(1, 2, dtype=torch.float64, requires_grad=True),
            torch.eye(2, dtype=torch.float64)[None].clone().requires_grad_(),
            torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)]
    scale = torch.ones(1, dtype=torch.float64)
    shift = torch.zeros(1, dtype=torch.float64)
    _loss(q, k_pos, k_neg, maps, scale, shift, weights=weights,
          pairwise=pairwise, listwise=listwise).backward()
    with torch.no_grad():
        wq, bq, wk, bk = (p - 0.5 * p.grad for p in maps)
        q_hat = q[0, 0] @ wq[0].T + bq[0]
        heavy, light = (float(q_hat @ (k @ wk[0].T + bk[0])) for k in k_pos[0])
    return heavy, light


def test_the_mass_weighted_gradient_ranks_the_heavy_key_first() -> None:
    heavy, light = _logits_after_one_step(torch.tensor([[0.9, 0.1]], dtype=torch.float64))
    assert heavy > light  # the heavy key now scores above the light one
    same_heavy, same_light = _logits_after_one_step(None)
    assert same_heavy == same_light  # uniform weights: the mirror image, no order


def test_uniform_weights_are_the_unweighted_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k_pos = torch.randn(2, 5, 3, generator=gen), torch.randn(2, 5, 3, generator=gen)
    k_neg = torch.randn(2, 5, 2, 3, generator=gen)
    maps = [torch.randn(2, 2, 3, generator=gen), torch.zeros(2, 2),
            torch.randn(2, 2, 3, generator=gen), torch.zeros(2, 2)]
    scale, shift = torch.ones(2), torch.zeros(2)
    plain = _loss(q, k_pos, k_neg, maps, scale, shift)
    weighted = _loss(q, k_pos, k_neg, maps, scale, shift, weights=torch.full((2, 5), 0.3))
    torch.testing.assert_close(weighted, plain)


def test_lowrank_mass_trains_and_says_so() -> None:
    gen = torch.Generator().manual_seed(1)
    records = [cluster_record(gen, 24, uniform_probs=True) for _ in range(4)]  # rows differ
    fitted = fit_projections(records, "lowrank-mass", rank=2, epochs=1, batch_size=32)
    assert fitted.metadata["objective"] == "lowrank-mass" and fitted.kind == "augmented"
    start = fit_lowrank(records, rank=2)
    uniform = refine_lowrank(start, records, epochs=1, batch_size=32)
    assert not torch.equal(fitted.weight, uniform.weight)  # the weighting changed the fit
    with pytest.raises(ValueError, match="weighting must be one of"):
        refine_lowrank(start, records, weighting="heavy")


@pytest.mark.parametrize("pairwise", [False, True])
def test_the_pairwise_term_ranks_the_heavy_key_first_too(pairwise) -> None:
    heavy, light = _logits_after_one_step(torch.tensor([[0.9, 0.1]], dtype=torch.float64),
                                          pairwise=pairwise)
    assert heavy > light
    same_heavy, same_light = _logits_after_one_step(None, pairwise=pairwise)
    assert same_heavy == same_light


def test_the_pairwise_term_reads_only_each_rows_order() -> None:
    """The term is ``−log σ(z_pos − z_neg)``: it adds to the pointwise loss, does not move
    with the shared shift, and weighs each positive by its weight."""
    gen = torch.Generator().manual_seed(2)
    q, k_pos = torch.randn(2, 5, 3, generator=gen), torch.randn(2, 5, 3, generator=gen)
    k_neg = torch.randn(2, 5, 2, 3, generator=gen)
    maps = [torch.randn(2, 2, 3, generator=gen), torch.zeros(2, 2),
            torch.randn(2, 2, 3, generator=gen), torch.zeros(2, 2)]
    scale, weights = torch.ones(2), torch.rand(2, 5, generator=gen)

    def term(shift: torch.Tensor) -> torch.Tensor:
        return (_loss(q, k_pos, k_neg, maps, scale, shift, weights=weights, pairwise=True)
                - _loss(q, k_pos, k_neg, maps, scale, shift, weights=weights))

    torch.testing.assert_close(term(torch.zeros(2)), term(torch.full((2,), 3.0)))
    q_hat = q @ maps[0].transpose(1, 2)
    z_pos = (q_hat * (k_pos @ maps[2].transpose(1, 2))).sum(-1)
    z_neg = torch.einsum("hbr,hbnr->hbn", q_hat, torch.einsum("hbnd,hrd->hbnr", k_neg, maps[2]))
    expected = -(weights * torch.nn.functional.logsigmoid(z_pos[..., None] - z_neg).mean(-1)
                 ).sum() / weights.sum()
    torch.testing.assert_close(term(torch.zeros(2)), expected)


@pytest.mark.parametrize("objective", ["lowrank-pairwise", "lowrank-listwise"])
def test_row_term_objectives_train_and_say_so(objective: str) -> None:
    gen = torch.Generator().manual_seed(1)
    records = [cluster_record(gen, 24, uniform_probs=True) for _ in range(4)]
    fitted = fit_projections(records, objective, rank=2, epochs=1, batch_size=32)
    assert fitted.metadata["objective"] == objective and fitted.kind == "augmented"
    mass = fit_projections(records, "lowrank-mass", rank=2, epochs=1, batch_size=32)
    assert not torch.equal(fitted.weight, mass.weight)  # the row term changed the fit


def _gold_auc(projections, records) -> float:
    """How often a gold edge's bilinear logit tops a non-edge's, over every layer and head."""
    pos, neg = [], []
    for record in records:
        for layer, graph in enumerate(record.layers):
            q = torch.baddbmm(projections.bias[layer][:, None], graph.queries.float(),
                              projections.weight[layer].transpose(1, 2))
            k = torch.baddbmm(projections.key_bias[layer][:, None], graph.keys.float(),
                              projections.key_weight[layer].transpose(1, 2))
            z = q @ k.transpose(1, 2)
            pos.append(z[graph.gold])
            neg.append(z[~graph.gold])
    return float((torch.cat(pos)[:, None] > torch.cat(neg)[None]).double().mean())


def test_max_steps_bounds_each_layers_epoch_and_the_capped_fit_still_learns() -> None:
    gen = torch.Generator().manual_seed(3)
    records = [cluster_record(gen, 24) for _ in range(4)]  # ~26 steps of 32 positives a layer
    start = fit_lowrank(records, rank=1)  # under capacity: room to learn
    options = {"lr": 0.02, "epochs": 6, "batch_size": 32}
    free = refine_lowrank(start, records, max_steps=None, **options)
    capped = refine_lowrank(start, records, max_steps=8, **options)
    assert all(steps > 8 * 6 for steps in free.metadata["steps"])  # the cap binds here
    assert capped.metadata["steps"] == [8 * 6] * len(records[0].layers)
    assert capped.metadata["max_steps"] == 8
    # on a uniform sample of the positives the fit still separates gold from non-gold
    before, after = _gold_auc(start, records), _gold_auc(capped, records)
    assert after > before + 0.03 and after > 0.8, (before, after)
    # a cap that does not bind draws nothing: the very same fit as none
    natural = max(free.metadata["steps"]) // 6
    same = refine_lowrank(start, records, max_steps=natural, **options)
    assert torch.equal(same.weight, free.weight) and torch.equal(same.key_weight,
                                                                  free.key_weight)
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1 or None"):
        refine_lowrank(start, records, max_steps=0)


def test_dense_heads_keep_their_start_and_an_all_dense_layer_is_not_trained() -> None:
    """A head attending to every key of every row has no non-edge to contrast (the last
    layers of a random BERT-base): the refinement leaves it as it started, trains the rest."""
    import dataclasses

    gen = torch.Generator().manual_seed(4)
    records = []
    for _ in range(4):
        record = cluster_record(gen, 24)
        first, second = record.layers
        gold = first.gold.clone()
        gold[1] = True  # layer 0: head 1 dense
        dense0 = dataclasses.replace(first, gold=gold, prob_values=torch.ones(int(gold.sum())))
        full = torch.ones_like(second.gold)  # layer 1: every head dense
        dense1 = dataclasses.replace(second, gold=full, prob_values=torch.ones(int(full.sum())))
        records.append(dataclasses.replace(record, layers=[dense0, dense1]))
    start = fit_lowrank(records, rank=2)
    refined = refine_lowrank(start, records, lr=0.02, epochs=2, batch_size=32)
    assert refined.metadata["dense_heads"] == [[1], [0, 1]]
    assert refined.metadata["steps"][1] == 0  # nothing to learn in layer 1
    for name in ("weight", "bias", "key_weight", "key_bias"):
        torch.testing.assert_close(getattr(refined, name)[0, 1], getattr(start, name)[0, 1])
        torch.testing.assert_close(getattr(refined, name)[1], getattr(start, name)[1])
    assert not torch.allclose(refined.weight[0, 0], start.weight[0, 0])  # head 0 trained
    assert refined.metadata["logistic_bias"][1] == [0.0, 0.0]


def _listwise_term(weights: torch.Tensor | None, shift: float = 0.0) -> tuple[torch.Tensor, ...]:
    """The listwise term alone on random rows, and its gradient w.r.t. the query map."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)
    k_pos = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)
    k_neg = torch.randn(2, 5, 2, 3, generator=gen, dtype=torch.float64)
    maps = [torch.randn(2, 2, 3, generator=gen, dtype=torch.float64).requires_grad_(),
            torch.zeros(2, 2, dtype=torch.float64),
            torch.randn(2, 2, 3, generator=gen, dtype=torch.float64),
            torch.zeros(2, 2, dtype=torch.float64)]
    scale, shift_t = torch.ones(2, dtype=torch.float64), torch.full((2,), shift,
                                                                   dtype=torch.float64)
    term = (_loss(q, k_pos, k_neg, maps, scale, shift_t, weights=weights, listwise=True)
            - _loss(q, k_pos, k_neg, maps, scale, shift_t, weights=weights))
    (grad,) = torch.autograd.grad(term, maps[0])
    q_hat = q @ maps[0].detach().transpose(1, 2)
    z_pos = (q_hat * (k_pos @ maps[2].transpose(1, 2))).sum(-1)
    z_neg = torch.einsum("hbr,hbnr->hbn", q_hat, torch.einsum("hbnd,hrd->hbnr", k_neg, maps[2]))
    return term.detach(), grad, z_pos, z_neg


@pytest.mark.numerical
def test_the_listwise_term_ranks_the_heavy_key_first() -> None:
    """On the hand-made row, one gradient step of the mass-weighted listwise objective puts
    the heavy key ahead of the light one; uniform weights leave the mirror image tied."""
    heavy, light = _logits_after_one_step(torch.tensor([[0.9, 0.1]], dtype=torch.float64),
                                          listwise=True)
    assert heavy > light
    same_heavy, same_light = _logits_after_one_step(None, listwise=True)
    assert same_heavy == same_light


@pytest.mark.numerical
def test_the_listwise_term_is_the_gold_cross_entropy_of_each_rows_softmax() -> None:
    """The term is ``−Σ p · log softmax(z_pos, z_neg…)_pos / Σ p`` (float64), and a shared
    shift of every logit moves neither it nor its gradient (a softmax within the row)."""
    weights = torch.rand(2, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    term, grad, z_pos, z_neg = _listwise_term(weights)
    row = torch.cat([z_pos[..., None], z_neg], -1)
    expected = -(weights * torch.log_softmax(row, -1)[..., 0]).sum() / weights.sum()
    torch.testing.assert_close(term, expected)
    shifted, shifted_grad, _, _ = _listwise_term(weights, shift=3.0)
    torch.testing.assert_close(shifted, term)
    torch.testing.assert_close(shifted_grad, grad)


