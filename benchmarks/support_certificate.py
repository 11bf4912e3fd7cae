"""How often block Sparsefinder's rows are exact on their own selection, and what the check
and the fallback cost.

For one layer of the default model (real q/k over consecutive 512-token windows, as in
``restricted.py``) at ``--n`` tokens, a selection — ``--selector keys``: block Sparsefinder's
default (``restricted.py``'s diagonal band ∪ single keys); ``oracle``: the gold tiles, so every
row's restricted τ is its true τ and only the bound is measured — then
:func:`~sparsefinder.attention.support_certificate.exact_block_sparse_entmax`. Reports how
many rows' τ on the selection differs from the true τ (a key outside it scores above the
restricted threshold, counted on the dense scores), how many rows the check certifies (it
must be every other row, and never a wrong one), with ``--bound`` how many of them the pooled
bound vouched for first (``--piece`` keys per bound), the max |Δ| of the output against dense
α-entmax, and the time of the exact path against the plain block path and dense entmax
(same inputs, one process, CPU). The output is exact either way: rows that fail the check
fall back to their full row.

    .venv/bin/python benchmarks/support_certificate.py [--n 2048] [--layer 3] [--block 64]
        [--bound] [--piece 64] [--candidates 2048] [--wide-keys 1024]

Last line: ``tau_differs=<f> certified=<f> by_bound=<f> max_abs_diff=<x>
vs_block=<t_block/t_exact> vs_dense=<t_dense/t_exact> fallback_s=<s>``:
the fallback alone (the rows that fail the check, recomputed on their full rows), so the
exact path's time splits into block, check and fallback.
``--smoke``: random q/k, n = 128, block 16.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import parse, parser  # noqa: E402


def _best_of(runs: int, fn) -> tuple[float, object]:  # noqa: ANN001
    best, out = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _rows_off_their_tau(q, k, v, tiles, extra, block: int, scaling: float):  # noqa: ANN001
    """bool (heads, n): rows whose threshold on the selection is not their true one — a key
    outside the selection scores above it (dense scores: for reporting, not the fast path)."""
    from sparsefinder.attention.block_sparse import block_sparse_rows, expand_blocks

    _, graph, thresholds = block_sparse_rows(q, k, v, tiles, block, extra_keys=extra)
    n = q.shape[1]
    selected = expand_blocks(graph, block, n, n, extra)
    scores = (q @ k.transpose(-1, -2)) * scaling
    outside = scores.masked_fill(selected, -torch.inf).amax(-1).double()
    return outside > thresholds


def _fallback_time(q, k, v, tiles, extra, block: int, scaling: float,  # noqa: ANN001
                   rows, runs: int) -> float:  # noqa: ANN001
    """Seconds of the exact path's fallback alone: ``rows`` recomputed on their full rows."""
    from sparsefinder.attention.block_sparse import block_sparse_entmax
    from sparsefinder.attention.support_certificate import dense_rows

    out = block_sparse_entmax(q, k, v, tiles, block, extra_keys=extra)
    return _best_of(runs, lambda: dense_rows(out, q, k, v, rows, scaling=scaling, alpha=1.5,
                                             causal=False, sliding_window=None))[0]


def main() -> int:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--n", type=int, default=2048)
    made.add_argument("--layer", type=int, default=3)
    made.add_argument("--block", type=int, default=64)
    made.add_argument("--bound", action="store_true",
                      help="vouch for rows by the pooled score bound before the exact check")
    made.add_argument("--piece", type=int, default=None, help="keys per bound (default block)")
    made.add_argument("--runs", type=int, default=3)
    made.add_argument("--selector", choices=["keys", "oracle"], default="keys")
    made.add_argument("--candidates", type=int, default=0,
                      help="keys selector: pooled candidates its second stage re-ranks")
    made.add_argument("--wide-keys", type=int, default=0,
                      help="keys selector with --candidates: keys a crowded block keeps")
    args = parse(made, smoke={"n": 128, "block": 16, "runs": 1})
    if args.piece is not None and not args.bound:
        raise SystemExit("--piece sets the pooled bound's keys per bound: add --bound")
    from sparsefinder.attention.block_sparse import block_sparse_entmax
    from sparsefinder.attention.entmax_ops import entmax_normalize
    from sparsefinder.attention.support_certificate import exact_block_sparse_entmax
    from sparsefinder.metrics.measures import block_graph

    torch.manual_seed(0)
    if args.smoke:
        q, k = (torch.randn(2, args.n, 16) * 3 for _ in range(2))
        source = "random q/k"
    else:
        from restricted import real_qk

        q, k, source = real_qk(args.layer, args.n)
    v = torch.randn_like(q)
    scaling = q.shape[-1] ** -0.5
    with torch.inference_mode():
        def dense():
            return entmax_normalize((q @ k.transpose(-1, -2)) * scaling, 1.5)

        t_dense, probs = _best_of(args.runs, dense)
        t_dense_out, reference = _best_of(args.runs, lambda: dense() @ v)
        if args.selector == "oracle":
            tiles, extra = block_graph(probs > 0, args.block), None
        else:
            from restricted import keys_selector

            tiles, extra = keys_selector(args.block, candidates=args.candidates,
                                         wide_keys=args.wide_keys)(q, k)
        t_block, _ = _best_of(args.runs, lambda: block_sparse_entmax(
            q, k, v, tiles, args.block, extra_keys=extra))
        t_exact, (out, cert) = _best_of(args.runs, lambda: exact_block_sparse_entmax(
            q, k, v, tiles, args.block, extra_keys=extra, bound=args.bound, piece=args.piece))
        wrong = _rows_off_their_tau(q, k, v, tiles, extra, args.block, scaling)
        t_fallback = _fallback_time(q, k, v, tiles, extra, args.block, scaling,
                                    ~cert.certified, args.runs)
    diff = float((out - reference).abs().max())
    if bool((cert.certified & wrong).any()):
        raise SystemExit("the certificate vouched for a row whose τ is wrong")
    bound = (f", by the bound (piece {args.piece or args.block}) {cert.bound_fraction:.3f}"
             if args.bound else "")
    from restricted import second_stage

    stage = f" ({second_stage(args.candidates, args.wide_keys)})" if args.candidates else ""
    print(f"{source}, layer {args.layer}, n={args.n}, {args.selector} selector{stage}, block "
          f"{args.block}: selected tiles {float(tiles.float().mean()):.3f} of all; rows "
          f"whose τ differs {float(wrong.double().mean()):.3f}; certified rows "
          f"{cert.certified_fraction:.3f}{bound} ({cert.fallback_rows} of "
          f"{cert.rows} fell back); max |Δ| vs dense {diff:.2e}; time: dense {t_dense_out:.3f} s,"
          f" block {t_block:.3f} s, certified block {t_exact:.3f} s, of which the fallback "
          f"{t_fallback:.3f} s (best of {args.runs})")
    print(f"tau_differs={float(wrong.double().mean()):.4f} "
          f"certified={cert.certified_fraction:.4f} by_bound={cert.bound_fraction:.4f} "
          f"max_abs_diff={diff:.3e} "
          f"vs_block={t_block / t_exact:.3f} vs_dense={t_dense_out / t_exact:.3f} "
          f"fallback_s={t_fallback:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
