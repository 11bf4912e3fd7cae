"""Training pairs: negatives come from the keys a row may attend to, local windows included."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.projections.pairs import PairsObjective, _layer_pairs, sample_negatives

HEADS, N, D, WINDOW = 2, 24, 4, 5


def _record(sliding_window, causal=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(HEADS, N, D, generator=g), torch.randn(HEADS, N, D, generator=g)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None]
    gold = (i == j).expand(HEADS, N, N).clone()  # the diagonal, always allowed
    gold[1] |= (i - j == 1)  # head 1 also attends to the previous token
    layer = LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 1.0,
                       sliding_window=sliding_window)
    return AttentionRecord(text="x", tokens=["t"] * N, offsets=[(0, 0)] * N,
                           special=[False] * N, causal=causal, layers=[layer])


def _negative_positions(record, num=50):
    pairs = _layer_pairs([record], 0)
    negs = sample_negatives(pairs.gold_flat, pairs.gold_base, pairs.n_allowed, num,
                            torch.Generator().manual_seed(1))
    rows = pairs.k_base[:, None] + negs  # rows into k_table: head * N + key position
    query = (pairs.q_row - pairs.head * N)[:, None].expand_as(rows)
    return pairs.head[:, None].expand_as(rows), query, rows - pairs.head[:, None] * N


def test_a_local_layer_draws_negatives_only_inside_its_window():
    record = _record(WINDOW)
    head, query, key = _negative_positions(record)
    assert ((query - key >= 0) & (query - key < WINDOW)).all()
    assert not record.layers[0].gold[head, query, key].any()  # non-edges only
    assert (query - key == WINDOW - 1).any()  # the whole window is reachable
    pairs = _layer_pairs([record], 0)  # query 0 sees only itself: no negative, no positive
    assert not ((pairs.q_row - pairs.head * N) == 0).any()


def test_causal_and_full_layers_draw_from_the_past_or_every_key():
    head, query, key = _negative_positions(_record(None))
    assert (key <= query).all() and (query - key >= WINDOW).any()
    head, query, key = _negative_positions(_record(None, causal=False))
    assert (key > query).any() and (key != query).all()


def test_softmax_layers_are_not_trained_and_predict_every_key(sparse_modernbert_records):
    """ModernBERT's local layers ran softmax (dense gold): training leaves their maps at zero
    (every key at distance 0: the whole window predicted) and lists them in the metadata."""
    from sparsefinder.projections.hinge import train_projections
    from sparsefinder.projections.logistic import train_logistic
    from sparsefinder.projections.pairs import softmax_layer

    records = sparse_modernbert_records
    assert [softmax_layer(records, i) for i in range(4)] == [False, True, True, False]
    projections = train_projections(records, rank=2, batch_size=64, alpha=1.5)
    assert projections.metadata["softmax_layers"] == [1, 2]
    assert projections.metadata["positives_per_layer"][1:3] == [0, 0]
    for layer in range(4):
        zero = bool((projections.weight[layer] == 0).all())
        assert zero == (layer in (1, 2))
    logistic = train_logistic(list(records), rank=2, batch_size=64)
    assert bool((logistic.weight[1] == 0).all()) and bool(logistic.weight[0].abs().sum() > 0)


def test_mixed_softmax_and_entmax_records_of_one_layer_are_refused(sparse_modernbert_records):
    import dataclasses

    import pytest

    from sparsefinder.projections.pairs import softmax_layer

    record = sparse_modernbert_records[0]
    odd = dataclasses.replace(record, layers=[dataclasses.replace(g, alpha=1.5)
                                              for g in record.layers])
    with pytest.raises(ValueError, match="layer 1 ran softmax in some records"):
        softmax_layer([record, odd], 1)


# ---------------------------------------------------------------- pairs, schedules, edges


def _prefix_record(n: int, m: int, seed: int) -> AttentionRecord:
    """A bidirectional record whose keys include a prefix (m > n): gold = each query's
    aligned key i + m - n and key 0."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(HEADS, n, D, generator=g), torch.randn(HEADS, m, D, generator=g)
    gold = torch.zeros(HEADS, n, m, dtype=torch.bool)
    gold[:, torch.arange(n), torch.arange(n) + m - n] = True
    gold[1, :, 0] = True
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=False,
                           layers=[LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 1.0)])


def test_layer_pairs_of_records_with_a_key_prefix_and_their_differences():
    records = [_prefix_record(5, 9, 0), _prefix_record(4, 6, 1)]
    pairs = _layer_pairs(records, 0)
    assert torch.equal(pairs.gold_edges, torch.tensor([5 + 4, 10 + 8]))  # summed over texts
    assert pairs.gold_edges.dtype == torch.long
    # every positive points at a gold key of its own text, query and head
    tq, tk = 5 + 4, 9 + 6
    for p in range(pairs.head.numel()):
        h = int(pairs.head[p])
        qi, kj = int(pairs.q_row[p]) - h * tq, int(pairs.k_row[p]) - h * tk
        rec, qi, kj = (0, qi, kj) if qi < 5 else (1, qi - 5, kj - 9)
        assert records[rec].layers[0].gold[h, qi, kj]
        assert int(pairs.n_allowed[p]) == (9, 6)[rec]
    ids = torch.arange(pairs.head.numel())[None]
    neg_rows = pairs.k_base[:, None] + sample_negatives(
        pairs.gold_flat, pairs.gold_base, pairs.n_allowed, 2, torch.Generator().manual_seed(0))
    dp, dn = pairs.first_negative_differences(ids, neg_rows)
    q = pairs.q_table[pairs.q_row]
    assert torch.equal(dp[0], q - pairs.k_table[pairs.k_row])
    assert torch.equal(dn[0], q - pairs.k_table[neg_rows[:, 0]])


def _fake_pairs(head: list[int], gold_edges: list[int]):
    from sparsefinder.projections.pairs import _LayerPairs

    return _LayerPairs(None, None, torch.tensor(head, dtype=torch.long), *([None] * 6),
                       gold_edges=torch.tensor(gold_edges))


def test_schedule_borrows_the_donor_for_dense_heads_only():
    from sparsefinder.projections.pairs import _schedule, dense_heads_of

    pairs = _fake_pairs([0, 0, 2, 2, 2], [2, 1, 3])  # head 1: one gold edge, no non-edge
    assert dense_heads_of(pairs, 3) == [1]
    with pytest.raises(ValueError, match=r"^heads \[1\] attend to every key"):
        _schedule(pairs, 3, 2, torch.Generator().manual_seed(0))
    ids, steps = _schedule(pairs, 3, 2, torch.Generator().manual_seed(0), borrow=[1])
    assert steps == 2 and ids.shape == (3, 4)
    assert set(ids[0].tolist()) == {0, 1} and set(ids[2].tolist()) == {2, 3, 4}
    assert set(ids[1].tolist()) <= {2, 3, 4}  # the donor: the head with the most positives
    ids, steps = _schedule(pairs, 3, 2, torch.Generator().manual_seed(0), steps=3, borrow=[1])
    assert steps == 3 and ids.shape == (3, 6)
    single = _fake_pairs([0], [1, 4])  # a donor with a single positive still lends it
    ids, _ = _schedule(single, 2, 1, torch.Generator().manual_seed(0), borrow=[1])
    assert ids.tolist() == [[0], [0]]
    with pytest.raises(ValueError, match=r"^heads \[0, 1\] attend to every key"):
        _schedule(_fake_pairs([], [1, 1]), 2, 1, torch.Generator().manual_seed(0),
                  borrow=[0, 1])


def test_exact_sampling_reaches_the_last_key_of_the_table():
    gold_flat = torch.ones(1000, dtype=torch.bool)
    gold_flat[[500, 999]] = False
    # row A: all 1000 keys, non-edges 500 and 999; row B: keys 900..999, non-edge 999 only.
    # Rejection sampling almost surely fails on both, so the exact path draws them.
    for seed in range(3):
        cols = sample_negatives(gold_flat, torch.tensor([0, 900]), torch.tensor([1000, 100]),
                                1, torch.Generator().manual_seed(seed))
        assert int(cols[0, 0]) in (500, 999) and int(cols[1, 0]) == 99


def test_mixed_softmax_message_says_what_to_do(sparse_modernbert_records):
    import dataclasses

    from sparsefinder.projections.pairs import softmax_layer

    record = sparse_modernbert_records[0]
    odd = dataclasses.replace(record, layers=[dataclasses.replace(g, alpha=1.5)
                                              for g in record.layers])
    with pytest.raises(ValueError, match=r"^layer 1 ran softmax in some records and entmax in "
                                         r"others; extract every record with the same α per "
                                         r"layer$"):
        softmax_layer([record, odd], 1)


class _Rows(PairsObjective):
    """Hands back the batch rows it is given (to see which slice a step reads)."""

    def batch_gradients(self, params, pairs, q_rows, k_rows, n_rows):
        return [q_rows, k_rows, n_rows], torch.zeros(())


def test_step_s_reads_slice_s_of_the_epoch_rows():
    records = [_record(None, causal=False, seed=s) for s in range(3)]
    objective = _Rows(records, heads=HEADS, batch_size=8, negatives_per_positive=2, seed=0)
    assert objective.start(0, torch.device("cpu"))
    steps = objective.draw(0)
    assert steps >= 2
    for step in (0, 1, steps - 1):
        got, _ = objective.gradients([], step)
        for part, rows in zip(got, objective.rows, strict=True):
            assert torch.equal(part, rows[:, step * 8:(step + 1) * 8])


def test_held_out_rows_are_drawn_from_their_own_seeded_generator():
    records = [_record(None, causal=False, seed=s) for s in range(4)]

    def held_rows():
        objective = _Rows(records[:3], heads=HEADS, batch_size=8, negatives_per_positive=1,
                          seed=0, held_out=records[3:])
        assert objective.start(0, torch.device("cpu"))
        return objective.held_rows

    first, again = held_rows(), held_rows()
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    empty = dataclasses.replace(records[3], layers=[dataclasses.replace(
        records[3].layers[0], gold=torch.zeros_like(records[3].layers[0].gold),
        prob_values=torch.ones(0))])
    objective = _Rows(records[:3], heads=HEADS, batch_size=8, negatives_per_positive=1, seed=0,
                      held_out=[empty])
    with pytest.raises(ValueError, match=r"^layer 0, held-out records: heads \[0, 1\] have no "
                                         r"gold edge at all in the training records; train on "
                                         r"more \(or longer\) texts; hold out more records \(a "
                                         r"larger early-stop fraction\) or train on more texts$"):
        objective.start(0, torch.device("cpu"))


def test_subsample_pairs_keeps_at_most_cap_uniform_positives_per_head():
    from sparsefinder.projections.pairs import subsample_pairs

    pairs = _layer_pairs([_record(None, causal=False, seed=s) for s in range(3)], 0)
    counts = torch.bincount(pairs.head, minlength=HEADS)  # head 1 has about twice head 0's
    cap = int(counts.min())  # binds on head 1 only
    gen = torch.Generator().manual_seed(0)
    kept = subsample_pairs(pairs, HEADS, cap, gen)
    assert torch.bincount(kept.head, minlength=HEADS).tolist() == [cap, cap]
    # every kept positive is one of the layer's, with all its fields, none twice
    sorted_key, order = (pairs.q_row * pairs.k_table.shape[0] + pairs.k_row).sort()

    def positions(some):  # where each of ``some``'s positives sits in ``pairs``
        return order[torch.searchsorted(sorted_key, some.q_row * pairs.k_table.shape[0]
                                        + some.k_row)]

    where = positions(kept)
    assert where.unique().numel() == where.numel()
    assert torch.equal(pairs.q_row[where], kept.q_row)
    assert torch.equal(pairs.k_row[where], kept.k_row)
    for name in ("head", "k_base", "n_allowed", "gold_base"):
        assert torch.equal(getattr(kept, name), getattr(pairs, name)[where]), name
    assert torch.equal(kept.q_table, pairs.q_table)  # the tables are shared, not cut
    # uniform: over many draws each of head 1's positives is kept about equally often
    hits = torch.zeros(pairs.head.numel())
    for _ in range(400):
        hits[positions(subsample_pairs(pairs, HEADS, cap, gen))] += 1
    assert (hits[pairs.head == 0] == 400).all()  # under the cap: every positive, every time
    hits = hits[pairs.head == 1]
    expected = 400 * cap / int(counts[1])
    assert (hits - expected).abs().max() < 5 * (expected * (1 - cap / int(counts[1]))) ** 0.5


def test_subsample_pairs_draws_nothing_where_the_cap_does_not_bind():
    from sparsefinder.projections.pairs import subsample_pairs

    pairs = _layer_pairs([_record(None, causal=False)], 0)
    gen = torch.Generator().manual_seed(0)
    before = gen.get_state()
    same = subsample_pairs(pairs, HEADS, int(pairs.head.numel()), gen)
    assert same is pairs and torch.equal(gen.get_state(), before)
