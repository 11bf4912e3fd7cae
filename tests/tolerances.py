"""Tolerances from the numbers compared, never from what one CPU happened to give.

Two float evaluations of the same maths (a fused path and a by-hand reference, a batched call
and one-at-a-time calls, the same code under AVX-512, AVX2 or plain kernels) round
differently. Standard error analysis bounds both: a sum or dot product of ``k`` terms,
evaluated in *any* order or blocking, is within ``γ_k · Σ|terms|`` of the exact value, with
``γ_k = k·u / (1 − k·u)`` and ``u = eps / 2`` the unit roundoff (Higham, *Accuracy and
Stability of Numerical Algorithms*, §3.1 and §3.5). Two such evaluations are within
``2·γ_k · Σ|terms| ≈ k · eps · scale`` of each other, where ``scale`` bounds ``Σ|terms|``.
That is :func:`bound`; the helpers below only choose ``k`` and ``scale`` from the tensors:

- :func:`tol_for`: ``assert_close`` keywords for a comparison whose accumulation length and
  magnitude are known (a sum of probabilities, a reduction, a chain of layers);
- :func:`matmul_bound`: the componentwise bound of ``a @ b``, ``k·eps·max(|a| @ |b|)``;
- :func:`score_bound`: how far two evaluations of attention scores ``q·kᵀ·scaling`` can be
  apart, from the rounding of the product and from the tolerances their q and k were held to;
- :func:`assert_same_support`: α-entmax supports compared edge for edge, except keys a score
  error can carry across the threshold (their probability is then at rounding level, and
  bounded by :func:`support_bound`);
- :func:`tau_err`, :func:`prob_tol`, :func:`sum_tol`, :func:`on_threshold`: the same for two
  α-entmax solvers run on the same scores, from the number of keys a row keeps
  (:func:`support_size`); :func:`entmax_prob_tol` and
  :func:`attention_output_tol` when their scores differ by a bounded error;
- :func:`transformer_terms`, :func:`config_terms`, :func:`forward_tol`: the accumulation
  length of a whole forward pass, for comparing hidden states of two evaluations of a (tiny)
  transformer;
- :func:`assert_layers_close`: two gold records of one text from two evaluations (batched and
  alone, sharded and not, bounded and dense), all of the above at once;
- :func:`training_tol`: the weights of two Adam trainings whose gradients round differently;
- :func:`ratio_tol`: metrics built from counts (float64) or summed probabilities (float32).

The bounds are worst cases (the rounding errors all add up), so they hold whatever the CPU's
kernels do; real differences are usually far below them (errors partly cancel). A bug — the
wrong scale, a dropped key, a softmax for an entmax — moves results by orders of magnitude more.
"""

from __future__ import annotations

import torch


def eps(dtype: torch.dtype = torch.float32) -> float:
    """Machine epsilon of a floating dtype (2^-23 for float32, 2^-52 for float64)."""
    return float(torch.finfo(dtype).eps)


def _magnitude(tensor: torch.Tensor) -> float:
    return float(tensor.detach().abs().max()) if tensor.numel() else 0.0


def bound(scale: float, *, terms: int = 1, dtype: torch.dtype = torch.float32) -> float:
    """``terms · eps(dtype) · scale``: how far two evaluations of a ``terms``-term accumulation
    of magnitude ``scale`` can be apart (``2·γ_terms·scale`` to first order)."""
    return max(int(terms), 1) * eps(dtype) * float(scale)


def tol_for(reference: torch.Tensor, *, terms: int = 1, dtype: torch.dtype | None = None,
            scale: float | None = None) -> dict[str, float]:
    """``torch.testing.assert_close`` keywords: ``atol`` = :func:`bound` of ``terms`` terms at
    the magnitude of ``reference`` (``scale`` overrides it) in ``dtype`` (default: the
    reference's own, so a float64 reference of float32 work must name float32), ``rtol`` 0."""
    dtype = dtype or reference.dtype
    magnitude = _magnitude(reference) if scale is None else float(scale)
    return {"atol": bound(magnitude, terms=terms, dtype=dtype), "rtol": 0.0}


def matmul_bound(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype | None = None) -> float:
    """Largest difference two evaluations of ``a @ b`` may show: ``k·eps·max(|a| @ |b|)``
    with ``k`` the inner dimension (the componentwise matrix-product bound)."""
    dtype = dtype or torch.promote_types(a.dtype, b.dtype)
    magnitude = _magnitude(a.detach().abs().double() @ b.detach().abs().double())
    return bound(magnitude, terms=a.shape[-1], dtype=dtype)


def score_bound(q: torch.Tensor, k: torch.Tensor, scaling: float, *, q_err: float = 0.0,
                k_err: float = 0.0, dtype: torch.dtype | None = None) -> float:
    """Largest difference between two evaluations of ``q @ kᵀ · scaling`` when their queries and
    keys differ by at most ``q_err`` and ``k_err`` elementwise: the product's rounding plus
    ``d·(q_err·max|k| + max|q|·k_err + q_err·k_err)``, times ``scaling`` (and its rounding)."""
    d = q.shape[-1]
    kt = k.transpose(-1, -2)
    carried = d * (q_err * _magnitude(k) + _magnitude(q) * k_err + q_err * k_err)
    product = matmul_bound(q, kt, dtype) + carried
    return abs(float(scaling)) * product * (1 + eps(dtype or q.dtype))


def support_bound(score_err: float, alpha: float, s: int = 0,
                  dtype: torch.dtype = torch.float32) -> float:
    """Largest probability a key can have on one side and lose on the other when the two
    computations' scores differ by at most ``score_err`` (and their solvers, on rows keeping
    ``s`` keys in ``dtype``, each round τ by :func:`tau_err`).

    α-entmax keeps key j iff its margin ``(α−1)·z_j − τ`` is positive, with probability
    ``margin^(1/(α−1))``. Moving every score by at most δ moves each ``(α−1)·z_j`` by
    ``(α−1)·δ`` and the threshold τ (monotone in every score, shifting with all of them) by at
    most as much, so a margin moves by at most ``2·(α−1)·δ`` (plus the solvers' τ rounding):
    only keys within that of the threshold can flip, with probability at most its β-th power.
    """
    if alpha <= 1.0:
        return 0.0  # softmax: every allowed key is kept, none can flip
    margin = 2.0 * (alpha - 1.0) * float(score_err) + (2 * tau_err(s, dtype) if s else 0.0)
    return margin ** (1.0 / (alpha - 1.0))


def entmax_prob_tol(score_err: float, alpha: float, s: int,
                    dtype: torch.dtype = torch.float32) -> float:
    """How far two α-entmax probabilities of a row keeping ``s`` keys (:func:`support_size`;
    the row length for softmax) may be apart when their scores differ
    by at most ``score_err``: ``p = m^β`` with margin ``m = (α−1)·z − τ`` moves by at most
    ``β·m^(β−1)·2·(α−1)·δ ≤ 2·δ`` (β·(α−1) = 1, m ≤ 1), plus the solvers' own
    :func:`prob_tol`. Softmax (α = 1) is 2-Lipschitz too (each p moves by ≤ 2·δ·p)."""
    return 2.0 * float(score_err) + 2 * prob_tol(s, max(alpha, 1.0), dtype)


def attention_output_tol(prob_err: float, probs: torch.Tensor, value: torch.Tensor,
                         slack: float = 0.0) -> float:
    """How far two evaluations of ``probs @ value`` (rows summing to 1) may be apart when their
    probabilities differ by at most ``prob_err`` on the ``s`` keys a row keeps and by at most
    ``slack`` (keys on the threshold, :func:`support_bound`) on the others:
    ``(s·prob_err + n·slack)·max|v|``, plus the product's rounding (``s`` nonzero terms of
    total weight 1: ``s·eps·max|v|``)."""
    n, kept = probs.shape[-1], support_size(probs)
    magnitude = _magnitude(value)
    return (kept * float(prob_err) + n * float(slack)) * magnitude + bound(
        magnitude, terms=kept, dtype=torch.promote_types(probs.dtype, value.dtype))


def transformer_terms(*, layers: int, hidden: int, intermediate: int, n: int) -> int:
    """The longest chain of accumulated terms through ``layers`` transformer layers on ``n``
    tokens, for :func:`tol_for`'s ``terms``: per layer the q/k/v and output projections
    (``hidden`` each), the scores (≤ ``hidden``), the normaliser and ``probs @ v`` (``n``
    each), two norms (mean and variance, ``2·hidden`` each) and the feed-forward
    (``hidden + intermediate``); and the embeddings' norm. An α-entmax normaliser adds its τ's
    rounding: on the same scores, two solvers' probabilities differ all in one direction (each
    is monotone in τ) and each row sums to 1 within :func:`sum_tol`, so their outputs differ by
    at most ``2·sum_tol·max|v|``: ``4·n + 8`` more terms. A first-order count: the layers'
    conditioning (a norm divides by its row's spread; a score error spreads over the kept keys)
    is taken as 1, which holds for the small random models the tests build."""
    per_layer = 10 * hidden + intermediate + 2 * n + (4 * n + 8)
    return 2 * hidden + layers * per_layer


def config_terms(config, n: int) -> int:
    """:func:`transformer_terms` of a transformers ``config`` (any family's size names)."""
    def first(*names: str, default: int | None = None) -> int:
        found = [getattr(config, name) for name in names if getattr(config, name, None)]
        return int(found[0]) if found else int(default)

    hidden = first("hidden_size", "n_embd", "dim")
    return transformer_terms(layers=first("num_hidden_layers", "n_layer", "n_layers"),
                             hidden=hidden, n=n,
                             intermediate=first("intermediate_size", "n_inner", "hidden_dim",
                                                default=4 * hidden))


def forward_tol(config, reference: torch.Tensor, n: int,
                dtype: torch.dtype | None = None) -> dict[str, float]:
    """``assert_close`` keywords for two evaluations of a whole forward pass of a model with
    this transformers ``config`` on ``n`` tokens: :func:`tol_for` with :func:`config_terms`."""
    return tol_for(reference, terms=config_terms(config, n), dtype=dtype)


def assert_same_support(a: torch.Tensor, b: torch.Tensor, *, slack: float) -> None:
    """``a > 0`` exactly where ``b > 0`` (dense probabilities of the same shape), except keys
    whose probability is at most ``slack`` on both sides (:func:`support_bound` for a score
    error, :func:`on_threshold` for a solver's τ): those lie within rounding of the
    threshold, where two correct computations may disagree."""
    assert a.shape == b.shape, (a.shape, b.shape)
    differ = (a > 0) != (b > 0)
    tiny = (a.double() <= slack) & (b.double() <= slack)
    bad = differ & ~tiny
    assert not bool(bad.any()), (
        f"{int(bad.sum())} of {int(differ.numel())} edges differ beyond the threshold slack "
        f"{slack:.3g}; first at {bad.nonzero()[0].tolist()}")


# α-entmax solvers ---------------------------------------------------------------------------
#
# Every solver (the package's sort-based functions, the block solver, the compiled row solver)
# works in units z = (x − max)·(α − 1) where the support lies within 1 of the maximum, so the
# sums that set τ (Σ[z − t]_+, Σ[z − t]_+², prefix cumsums up to the support size) have at most
# ``s`` nonzero terms of magnitude ≤ 1, s the support size (adding an exact zero rounds
# nothing, so the n − s keys outside the support cost no error; n bounds s), and the closed
# form adds a few roundings (a subtraction, a division, a square root): τ is within
# ``(2·s + 4)·eps`` of the exact τ*. That covers the loosest of them, the package's float32
# prefix cumsums (about ``s·eps/2``); the fast solvers' sums are shifted to their evaluation
# point, and the row solver works in float64, rounding only its output. A probability
# ``[z − τ]^β`` (β = 1/(α − 1)) moves by at most ``β·|δτ|`` (its derivative ``β·p^(1−1/β)``
# is ≤ β for p ≤ 1).


def support_size(*probs: torch.Tensor) -> int:
    """The most keys any row keeps in any of ``probs`` (same shape; at least 1): the ``s`` the
    solver bounds below take, tighter than the row length."""
    kept = probs[0] > 0
    for other in probs[1:]:
        kept = kept | (other > 0)
    return max(1, int(kept.sum(-1).max())) if kept.numel() else 1


def tau_err(s: int, dtype: torch.dtype = torch.float32) -> float:
    """How far a solver's τ may lie from the exact τ* on a row keeping ``s`` keys (above)."""
    return bound(1.0, terms=2 * s + 4, dtype=dtype)


def prob_tol(s: int, alpha: float, dtype: torch.dtype = torch.float32) -> float:
    """Largest difference of a probability between two correct solvers of a row keeping ``s``
    keys: ``β·|δτ|`` plus one rounding of the output (softmax, α = 1: s = the row length, its
    normaliser's terms)."""
    beta = 1.0 / (alpha - 1.0) if alpha > 1.0 else 1.0
    return max(1.0, beta) * tau_err(s, dtype) + eps(dtype)


def sum_tol(s: int, dtype: torch.dtype = torch.float32) -> float:
    """How far a solver's row may sum from 1: the closed form normalises the support it
    certified up to the rounding of its sums, and summing the row's ``s`` nonzero
    probabilities adds as many roundings again."""
    return bound(1.0, terms=2 * s + 4, dtype=dtype)


def on_threshold(alpha: float, s: int, dtype: torch.dtype = torch.float32) -> float:
    """Probability a key lying exactly on the threshold (z_j = τ*) may carry after rounding:
    a τ rounded below it leaves it ``(τ* − τ)^β ≤ tau_err^β`` where the exact answer is 0."""
    return tau_err(s, dtype) ** (1.0 / (alpha - 1.0))


# Gold records -------------------------------------------------------------------------------


def assert_layers_close(a, b, *, terms: int, dtype: torch.dtype = torch.float32) -> None:
    """Two layer graphs (:class:`~sparsefinder.data.records.LayerGraph`) of one text from two
    evaluations whose queries and keys went through ``terms`` accumulations in ``dtype`` (the
    layers before and the projection: :func:`transformer_terms` plus the hidden size): queries
    and keys within that bound (plus the records' rounding to float32 when ``dtype`` is finer),
    the gold graphs edge for edge except keys that q/k error can move across the threshold
    (:func:`support_bound`), the probabilities within :func:`entmax_prob_tol`."""
    stored = 0.0 if dtype == torch.float32 else eps(torch.float32)
    q_err = tol_for(b.queries, terms=terms, dtype=dtype)["atol"]
    k_err = tol_for(b.keys, terms=terms, dtype=dtype)["atol"]
    torch.testing.assert_close(a.queries, b.queries, rtol=0,
                               atol=q_err + stored * _magnitude(b.queries))
    torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=k_err + stored * _magnitude(b.keys))
    score_err = score_bound(b.queries, b.keys, b.scaling, q_err=q_err, k_err=k_err, dtype=dtype)
    pa, pb = a.probs().double(), b.probs().double()
    kept = support_size(pa, pb)
    alpha = float(getattr(b, "alpha", 1.5) or 1.5)
    assert_same_support(pa, pb, slack=support_bound(score_err, alpha, kept, dtype))
    torch.testing.assert_close(pa, pb, rtol=0,
                               atol=entmax_prob_tol(score_err, alpha, kept, dtype) + stored)


# Training runs ------------------------------------------------------------------------------

#: Adam's step is at most ``lr·(1 − β1)/√(1 − β2)`` per weight (Kingma & Ba, §2.1) with
#: torch's default betas (0.9, 0.999): about 3.2·lr.
ADAM_STEP = (1 - 0.9) / (1 - 0.999) ** 0.5


def training_tol(metadata: dict, *, world: int = 1) -> float:
    """How far the weights of two Adam trainings of the same batches may end apart when their
    gradients differ by rounding only (sums over another number of threads or ranks, another
    reduction order): each step's gradient is a sum over the batch's positives and negatives
    (and ``world`` ranks), so it moves by at most ``(terms)·eps`` relative to its terms, and
    so does that step's update; over the run's steps (``epochs`` × batches of the largest
    layer) of at most :data:`ADAM_STEP` each. First order: it takes the updates' sensitivity
    to their gradient as 1 (a gradient that cancels to near zero makes Adam's step larger
    relative to its own rounding; the tests' batches do not)."""
    batch = int(metadata["batch_size"])
    terms = batch * (1 + int(metadata.get("negatives_per_positive", 1))) + world
    positives = max(metadata.get("positives_per_layer") or [batch])
    steps = int(metadata["epochs"]) * -(-int(positives) // batch)
    return steps * ADAM_STEP * float(metadata["lr"]) * bound(1.0, terms=terms)


# Metrics ------------------------------------------------------------------------------------


def ratio_tol(terms: int, dtype: torch.dtype = torch.float64) -> float:
    """Two evaluations of a metric in [0, 1] built from ``terms`` additions of values ≤ 1 and a
    division or two (a recall, a precision, a sparsity, their means over rows and heads): in
    float64 for the counted metrics, float32 where probabilities are summed (mass recall)."""
    return bound(1.0, terms=terms + 2, dtype=dtype)


def entmax_attention_tol(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         probs: torch.Tensor | None = None, alpha: float = 1.5) -> float:
    """How far two correct evaluations of α-entmax attention on (q, k, v) (scaling d^-½) may
    be apart: the scores' rounding bound carried through the probabilities to the output
    (``probs``: the reference's probabilities, whose support size tightens it)."""
    probs = torch.ones(1, k.shape[1], dtype=q.dtype) if probs is None else probs
    score_err = score_bound(q, k, q.shape[-1] ** -0.5)
    kept = support_size(probs)
    prob_err = entmax_prob_tol(score_err, alpha, kept, q.dtype)
    slack = support_bound(score_err, alpha, kept, q.dtype)
    return attention_output_tol(prob_err, probs, v, slack)
