"""How often block Sparsefinder's rows are certified exact, and what the fallback costs.

For one layer of the default model (real q/k over consecutive 512-token windows, as in
``restricted.py``) at ``--n`` tokens: the block graph of the gold tiles (an oracle selector:
every gold edge inside a selected block, so every row's restricted τ equals its true τ), then
:func:`~sparsefinder.attention.support_certificate.exact_block_sparse_entmax`. Reports the
fraction of rows the cheap bound certifies (``--piece`` keys per bound), the max |Δ| of the
output against dense α-entmax, and the time of the certified path against the plain block
path and dense entmax (same inputs, one process, CPU). Whatever the bound certifies, the
output is exact: the rest fall back to their full row.

    .venv/bin/python benchmarks/support_certificate.py [--n 2048] [--layer 3] [--block 64]
        [--piece 64]

Last line: ``certified=<f> max_abs_diff=<x> vs_block=<t_block/t_exact> vs_dense=<t_dense/t_exact>``.
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


def main() -> int:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--n", type=int, default=2048)
    made.add_argument("--layer", type=int, default=3)
    made.add_argument("--block", type=int, default=64)
    made.add_argument("--piece", type=int, default=None, help="keys per bound (default block)")
    made.add_argument("--runs", type=int, default=3)
    args = parse(made, smoke={"n": 128, "block": 16, "runs": 1})
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
        tiles = block_graph(probs > 0, args.block)
        t_block, _ = _best_of(args.runs, lambda: block_sparse_entmax(q, k, v, tiles,
                                                                     args.block))
        t_exact, (out, cert) = _best_of(args.runs, lambda: exact_block_sparse_entmax(
            q, k, v, tiles, args.block, piece=args.piece))
    diff = float((out - reference).abs().max())
    print(f"{source}, layer {args.layer}, n={args.n}, block {args.block}, piece "
          f"{args.piece or args.block}: gold tiles {float(tiles.float().mean()):.3f} of all; "
          f"certified rows {cert.certified_fraction:.3f} ({cert.fallback_rows} of "
          f"{cert.rows} fell back); max |Δ| vs dense {diff:.2e}; time: dense {t_dense_out:.3f} s,"
          f" block {t_block:.3f} s, certified block {t_exact:.3f} s (best of {args.runs})")
    print(f"certified={cert.certified_fraction:.4f} max_abs_diff={diff:.3e} "
          f"vs_block={t_block / t_exact:.3f} vs_dense={t_dense_out / t_exact:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
