"""Which exact 1.5-entmax is faster on a GPU, by row length: the sort or the block solver.

On a CPU the compiled row solver wins at every size. On a GPU the ``entmax`` package's
sort-based ``entmax15`` runs as a few large kernels, while the block solver
(``engine='blocks'``) launches ~200 small ones and synchronises to size its gathers, a fixed
cost that only long rows amortise. This measures both (and SDPA softmax, for scale) on the
default model's real q/k of one layer (12 heads × 32 dims, the validation passages joined,
as in ``benchmarks/restricted.py``), for n = 256 … 8192 keys per row, n queries, fp32,
``torch.inference_mode``, each timing bracketed by ``torch.cuda.synchronize``, the median of
``--repeats`` after two warm-ups.

``--save FILE`` (on any machine) writes the q/k to FILE; ``--qk FILE`` reads them instead of
running the model (so a GPU machine needs no model weights).

Without a CUDA GPU it times the same on the CPU (and says so); ``--device cuda`` there skips
with the reason. ``--smoke``: n = 256 and 512, one repeat, seeded random q/k (no model run;
``--smoke --no-random-qk`` runs it).

Last line: ``crossover=<smallest n where blocks beat the sort, 0 if never> cuda=<0|1>``.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gpu_solver.py``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cuda_missing, parse, parser, skip  # noqa: E402

SIZES = (256, 512, 1024, 2048, 4096, 8192)


def _time(fn, repeats: int, sync) -> float:
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    from entmax import entmax15

    from sparsefinder.attention.entmax_ops import entmax15_fast

    made = parser(__doc__.split("\n")[0])
    made.add_argument("--qk", help="read q/k from this file instead of running the model")
    made.add_argument("--save", help="write the q/k to this file and stop")
    made.add_argument("--layer", type=int, default=2)
    made.add_argument("--repeats", type=int, default=15)
    made.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    made.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                      help="where to time (default: cuda when a GPU is visible, else cpu)")
    made.add_argument("--random-qk", action=argparse.BooleanOptionalAction, default=False,
                      help="seeded Gaussian q/k instead of the model's (no model run)")
    args = parse(made, smoke={"sizes": [256, 512], "repeats": 1, "random_qk": True})
    missing = None if args.save else cuda_missing(args.device)
    if missing:
        skip(missing, crossover=0, cuda=0)
        return
    if args.qk:
        data = torch.load(args.qk, weights_only=True)
        q, k = data["q"], data["k"]
    elif args.random_qk:
        gen = torch.Generator().manual_seed(0)
        q, k = (torch.randn(12, max(args.sizes), 32, generator=gen) for _ in range(2))
    else:
        from restricted import real_qk

        q, k, _ = real_qk(args.layer, max(args.sizes))
    if args.save:
        torch.save({"q": q, "k": k}, args.save)
        print(f"saved q/k {tuple(q.shape)} to {args.save}")
        return
    device = torch.device(args.device)
    if device.type != "cuda":
        print("no CUDA device: timing on the CPU, where the compiled row solver is the default "
              "(the crossover is a GPU question)")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    source = "seeded random" if args.random_qk and not args.qk else f"layer {args.layer}"
    print(f"device {name}; q/k {tuple(q.shape)} ({source}); median of "
          f"{args.repeats} ms per call (12 heads, n queries × n keys)")
    print(f"{'n':>6}{'sort (pkg)':>12}{'blocks':>10}{'sdpa':>9}{'blocks/sort':>13}")
    crossover = 0
    with torch.inference_mode():
        for n in sorted(args.sizes):
            qn, kn = q[:, :n].to(device), k[:, :n].to(device)
            vn = torch.randn_like(kn)
            scores = torch.matmul(qn, kn.transpose(-1, -2)) * qn.shape[-1] ** -0.5
            sort_ms = _time(lambda s=scores: entmax15(s, dim=-1), args.repeats, sync)
            blocks_ms = _time(lambda s=scores: entmax15_fast(s, engine="blocks"),
                              args.repeats, sync)
            sdpa_ms = _time(lambda a=qn, b=kn, c=vn: torch.nn.functional
                            .scaled_dot_product_attention(a, b, c), args.repeats, sync)
            if blocks_ms < sort_ms and not crossover:
                crossover = n
            print(f"{n:>6}{sort_ms:>12.2f}{blocks_ms:>10.2f}{sdpa_ms:>9.2f}"
                  f"{blocks_ms / sort_ms:>12.2f}x")
    print(f"crossover={crossover} cuda={int(device.type == 'cuda')}")


if __name__ == "__main__":
    main()
