"""Long-context α-entmax attention on one device, against the field's kernel: SDPA softmax,
dense entmax, AdaSplash and block Sparsefinder (plain and exact), on the same inputs in one
process.

For each input (``--inputs``: ``default`` = real q/k of one layer of the default model over
consecutive 512-token validation windows, as ``restricted.py`` reads them, or ``--qk FILE``
saved by ``gpu_solver.py --save``; ``random`` = seeded Gaussian q/k at the default's scale;
``decoder`` = q/k of a long-context decoder saved the same way, ``--decoder-qk FILE``), each
length ``--sizes`` and each dtype ``--dtypes`` (fp32, fp16, bf16), every method runs on the
same q/k/v and reports:

- ``ms``: median of ``--repeats`` after a warm-up, each bracketed by a device synchronize;
- ``peak MiB``: the device's peak allocation during the call (CUDA; NaN on a CPU);
- ``max |Δ|``: against exact 1.5-entmax attention computed tile by tile in float32
  (:func:`~sparsefinder.attention.gold_edges.entmax_edges` with values, memory O(n · tile));
  SDPA is softmax, so its Δ is how far softmax attention is from entmax, not an error;
- ``recall``: the gold edges the method computes (1 for dense methods and AdaSplash, the
  selection's edge recall for block Sparsefinder, whose exact variant recomputes the rest;
  the selector reads q/k in the row's precision, so fp16 and bf16 rows have their own);
- ``rows τ off`` (block methods): the rows whose selection misses a gold key, so that τ found
  on the selection is not the row's true τ (by sparse-consistency it is exactly when none is
  missed);
- ``rows certified`` (the exact variants): the rows the support certificate's check passes
  (it must be every row not ``τ off``); the others were recomputed on their full row.

Methods: ``sdpa`` (``scaled_dot_product_attention``), ``dense-entmax`` (the project's exact
solver over the full scores, rows in chunks: ``support_certificate.dense_rows``),
``adasplash`` (``pip install adasplash``: the ``gpu`` extra; CUDA only, skipped with the
reason otherwise), ``select`` (block Sparsefinder's selection alone: the block graph and
single keys of its default selector, as in ``restricted.py``), ``block`` (that selection,
then entmax on it), ``block-exact`` (the same with the support
certificate: each row's unselected keys checked against its threshold in one pass, and the
dense fallback of the rows that fail), ``block-triton`` (the same selection, key blocks and
single keys, in one Triton kernel, :mod:`~sparsefinder.attention.triton_block_sparse`; CUDA
only here) and ``block-triton-exact`` (the kernel, the check's kernel
:mod:`~sparsefinder.attention.triton_support_check`, and the fallback). ``check`` and
``check-triton`` time the support certificate's check alone (the selection, then each row's
best unselected score: the tensor path in chunks, or the kernel), so the exact variants' time
splits into block, check and fallback, and ``block``'s into select and attention; their
output is no attention, so they have no Δ.

    .venv/bin/python benchmarks/gpu_attention.py --device cuda [--sizes 4096 8192 16384 32768]
        [--dtypes fp32 fp16] [--inputs default random] [--repeats 5]

Each row is printed (and appended to ``--table FILE`` as a Markdown row) as soon as it is
measured, so a run cut short by a time limit keeps what it measured. A method whose call takes
longer than ``--slow-s`` is timed once and not run at larger n (the row says so). ``--causal``
runs every method causally (AdaSplash then dispatches to its causal AdaSplash-2 kernel).
The reference support is kept bit-packed (:mod:`~sparsefinder.attention.support_bits`:
1.5 GiB for 12 heads at n = 32 768), so no edge list caps n.

Last line: ``device=<cpu|cuda> n=<largest> block_vs_sdpa=<t_sdpa/t_block>
block_vs_adasplash=<t_ada/t_block or nan> block_recall=<r> exact_max_diff=<x>
triton_vs_sdpa=<t_sdpa/t_triton> triton_vs_adasplash=<t_ada/t_triton>`` for the first input at
the largest n in fp16 where run (else the first dtype). On a CPU the kernel runs only under
``TRITON_INTERPRET=1`` (slowly). ``--smoke``: CPU, random q/k, n = 64, fp32, one repeat.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cuda_missing, parse, parser, skip  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: The block selector's budget from each length on: (single keys a query block keeps, keys a
#: crowded block keeps (BlockKeySparsefinder.wide_keys), candidates the second stage re-ranks),
#: all chosen on TRAIN q/k with tools/choose_candidates.py. Up to 8192: --pooling and --wide 1024
#: (mean edge recall over layers 1-4 0.9986 at n = 4096 and 0.9917 at 8192). Longer: --budgets
#: (a query block needs 204-388 gold keys outside its band on average there; the first budget
#: reaching 0.99: 0.9905 at 16 384 and 0.9916 at 32 768, where 448 keys and 6144 candidates
#: give 0.9856).
BUDGETS = {0: (448, 1024, 3072), 16384: (448, 1024, 6144), 32768: (896, 1792, 8192)}
#: ``--smoke``: a CPU, random q/k, n = 64, fp32, one repeat.
SMOKE = {"device": "cpu", "sizes": [64], "dtypes": ["fp32"], "inputs": ["random"], "repeats": 1,
         "block": 16}
METHODS = ("sdpa", "dense-entmax", "adasplash", "select", "block", "block-exact",
           "block-triton", "block-triton-exact", "check", "check-triton")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(fn, repeats: int, device: torch.device, slow_s: float
             ) -> tuple[float, float, object, float]:
    """(median ms, peak MiB or NaN, last result, seconds of the warm-up call) of ``fn()``;
    a call slower than ``slow_s`` is timed once."""
    start = time.perf_counter()
    result = fn()  # warm-up (compiles, allocator)
    _sync(device)
    first = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(1 if first > slow_s else repeats):
        start = time.perf_counter()
        result = fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    peak = ((torch.cuda.max_memory_allocated(device) - base) / 2**20
            if device.type == "cuda" else math.nan)
    return statistics.median(times), peak, result, first


def _inputs(kind: str, n: int, args) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    if kind == "random":
        g = torch.Generator().manual_seed(n)
        return tuple(torch.randn(12, n, 32, generator=g) * 2.5 for _ in range(2))
    path = args.qk if kind == "default" else args.decoder_qk
    if path:
        saved = torch.load(path, weights_only=True)
        q, k = saved["q"], saved["k"]
        if q.shape[1] < n:
            raise SystemExit(f"{path} holds {q.shape[1]} tokens, fewer than n={n}")
        return q[:, :n].float().contiguous(), k[:, :n].float().contiguous()
    if kind == "decoder":
        raise SystemExit("--inputs decoder needs --decoder-qk FILE (q/k saved by "
                         "decoder_supports.py --save-qk)")
    from restricted import real_qk

    q, k, _ = real_qk(args.layer, n)
    return q, k


def _method(name: str, args, n: int):  # noqa: ANN001, ANN202
    """(q, k, v) → output for one method at length ``n``, or a reason it can't run."""
    import torch.nn.functional as F

    from sparsefinder.attention.block_sparse import block_sparse_entmax
    from sparsefinder.attention.support_certificate import dense_rows, exact_block_sparse_entmax

    causal = args.causal
    if name == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "dense-entmax":
        def dense(q, k, v):  # every row as the exact variants' fallback computes it
            out = torch.empty_like(q)
            dense_rows(out, q, k, v, torch.ones(q.shape[:2], dtype=torch.bool, device=q.device),
                       scaling=q.shape[-1] ** -0.5, alpha=1.5, causal=causal,
                       sliding_window=None, budget_mib=4096 if q.is_cuda else 256)
            return out
        return dense
    if name == "adasplash":
        if args.device_obj.type != "cuda":
            return "AdaSplash's Triton kernels need CUDA"
        try:
            from adasplash import adasplash
        except ImportError:
            return "adasplash is not installed (pip install adasplash: the gpu extra)"
        return lambda q, k, v: adasplash(q[None], k[None], v[None], alpha=1.5,
                                         is_causal=causal)[0]
    selector = _selector(args, n)

    def select(q, k):  # in the row's precision: half q/k take the half products
        return selector(q, k, causal=causal)

    if ("triton" in name and args.device_obj.type != "cuda"
            and os.environ.get("TRITON_INTERPRET") != "1"):
        return "the Triton kernel runs on a CPU only in its interpreter (TRITON_INTERPRET=1)"
    if name == "block-triton":
        from sparsefinder.attention.triton_block_sparse import triton_block_sparse_entmax

        def kernel(q, k, v):
            graph, extra = select(q, k)
            return triton_block_sparse_entmax(q, k, v, graph, args.block, extra_keys=extra,
                                              causal=causal)
        return kernel
    if name == "select":
        return lambda q, k, v: select(q, k)
    if name == "block":
        def block(q, k, v):
            graph, extra = select(q, k)
            return block_sparse_entmax(q, k, v, graph, args.block, extra_keys=extra,
                                       causal=causal)
        return block

    if name.startswith("check"):
        from sparsefinder.attention.block_sparse import repair_block_graph
        from sparsefinder.attention.support_certificate import unselected_max
        from sparsefinder.attention.triton_support_check import triton_unselected_max

        def check(q, k, v):
            graph, extra = select(q, k)
            graph = repair_block_graph(graph, causal=causal, warn=False)
            if name == "check-triton":
                return triton_unselected_max(q, k, graph, args.block, extra_keys=extra,
                                             causal=causal)
            return unselected_max(q, k, graph, args.block, extra_keys=extra, causal=causal,
                                  budget_mib=4096 if q.is_cuda else 256)
        return check

    engine = "triton" if name == "block-triton-exact" else "torch"

    def exact(q, k, v):
        graph, extra = select(q, k)
        out, certificate = exact_block_sparse_entmax(
            q, k, v, graph, args.block, extra_keys=extra, causal=causal, engine=engine,
            fallback_mib=4096 if q.is_cuda else 256)  # few large chunks where memory allows
        args.certified = certificate.certified_fraction
        return out
    return exact


def budget(args: argparse.Namespace, n: int) -> tuple[int, int, int]:
    """(single keys, crowded blocks' keys, candidates) of the block selector at length ``n``:
    :data:`BUDGETS`' entry, each overridden by ``--n-keys``, ``--wide-keys`` and
    ``--candidates`` where given. Without a second stage no block is widened."""
    keys, wide, count = BUDGETS[max(start for start in BUDGETS if start <= n)]
    keys = keys if args.n_keys is None else args.n_keys
    count = count if args.candidates is None else args.candidates
    wide = wide if args.wide_keys is None else args.wide_keys
    return keys, wide if count else 0, count


def _selector(args: argparse.Namespace, n: int):
    """(q, k, causal=) → (block graph, extra keys): the block selector of ``--sub-block`` and
    :func:`budget` at length ``n``, the one every block method and the recall column use."""
    from restricted import keys_selector

    keys, wide, count = budget(args, n)
    return keys_selector(args.block, keys, sub_block=args.sub_block, candidates=count,
                         wide_keys=wide)


def _describe(args: argparse.Namespace) -> str:
    """The selector of each length of the run, for the table's header."""
    from restricted import second_stage

    def at(n: int) -> str:
        keys, wide, count = budget(args, n)
        return f"n = {n}: {keys} single keys, {second_stage(count, wide) or 'one stage'}"

    return f"sub-blocks of {args.sub_block}; " + "; ".join(map(at, sorted(args.sizes)))


def _recall(q: torch.Tensor, k: torch.Tensor, support, args: argparse.Namespace,  # noqa: ANN001
            ) -> tuple[float, float]:
    """(gold-pair recall, fraction of rows missing a gold key) of the block selector
    (:func:`_selector`): key blocks and single keys. One head's (n, n) masks at a time."""
    from sparsefinder.attention.block_sparse import expand_blocks

    block = args.block
    graph, extra = _selector(args, q.shape[1])(q, k, causal=args.causal)
    n = q.shape[1]
    hit = total = off = 0
    for h in range(q.shape[0]):
        gold = support.to_dense(h)
        selected = expand_blocks(graph[h:h + 1], block, n, n,
                                 None if extra is None else extra[h:h + 1])[0]
        total += int(gold.sum())
        hit += int((gold & selected).sum())
        off += int((gold & ~selected).any(-1).sum())
    return hit / max(total, 1), off / (q.shape[0] * n)


def _row(table: Path | None, *cells: object) -> None:
    """One result, printed now (and appended to the Markdown ``table``)."""
    print(" ".join(str(c) for c in cells), flush=True)
    if table is not None:
        with table.open("a") as handle:
            handle.write("| " + " | ".join(str(c) for c in cells) + " |\n")


def arguments() -> argparse.ArgumentParser:
    """The command line (its ``--smoke`` defaults are :data:`SMOKE`)."""
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--device", default="cuda")
    made.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    made.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["fp32", "fp16"])
    made.add_argument("--inputs", nargs="+", choices=["default", "random", "decoder"],
                      default=["default", "random"])
    made.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    made.add_argument("--layer", type=int, default=2)
    made.add_argument("--block", type=int, default=32)
    made.add_argument("--repeats", type=int, default=5)
    made.add_argument("--causal", action="store_true", help="causal attention everywhere")
    made.add_argument("--slow-s", type=float, default=20.0,
                      help="a call slower than this is timed once and skipped at larger n")
    made.add_argument("--table", type=Path, help="also append each row here (Markdown)")
    made.add_argument("--qk", help="q/k of the default model saved by gpu_solver.py --save")
    made.add_argument("--decoder-qk", help="q/k of a decoder (decoder_supports.py --save-qk)")
    made.add_argument("--candidates", type=int,
                      help="pooled candidates the block selector's second stage re-ranks by "
                           "each block's own queries (default: BUDGETS, by n; 0: one stage)")
    made.add_argument("--wide-keys", type=int,
                      help="with a second stage: single keys a crowded query block keeps "
                           "(default: BUDGETS, by n; 0: every block keeps --n-keys)")
    made.add_argument("--n-keys", type=int,
                      help="single keys a query block keeps (default: BUDGETS, by n)")
    made.add_argument("--sub-block", type=int, default=8,
                      help="queries the selector's pooled stage averages (default 8; 2 finds "
                           "more keys for 4x its products)")
    return made


def main() -> int:
    args = parse(arguments(), smoke=SMOKE)
    reason = cuda_missing(args.device)
    if reason:
        skip(reason, device=args.device)
        return 0
    device = args.device_obj = torch.device(args.device)
    if args.table is not None:
        with args.table.open("a") as handle:
            handle.write(f"\n{'causal' if args.causal else 'bidirectional'}, "
                         f"{device.type}, selector: {_describe(args)}\n\n"
                         "| input | n | dtype | method | ms | peak MiB | max abs diff | recall "
                         "| rows τ off | rows certified |\n"
                         "|---|---|---|---|---|---|---|---|---|---|\n")
    headline, too_slow = {}, {}
    for kind in args.inputs:
        for n in sorted(args.sizes):
            try:
                q32, k32 = (t.to(device) for t in _inputs(kind, n, args))
            except SystemExit as why:  # e.g. a corpus shorter than n: the other sizes still run
                _row(args.table, kind, n, "-", "inputs", str(why), "", "", "", "", "")
                continue
            v32 = torch.randn(q32.shape, generator=torch.Generator().manual_seed(7)).to(device)
            with torch.inference_mode():  # the selection follows the precision of its q/k
                support, reference = _reference(q32, k32, v32, args.causal)
                recalls = {name: _recall(q32.to(DTYPES[name]), k32.to(DTYPES[name]), support,
                                         args) for name in args.dtypes
                           if any(method.startswith("block") for method in args.methods)}
            del support
            for dtype_name in args.dtypes:
                dtype = DTYPES[dtype_name]
                q, k, v = (t.to(dtype) for t in (q32, k32, v32))
                for name in args.methods:
                    try:
                        run = _method(name, args, n)
                    except Exception as error:  # noqa: BLE001  (an optional package that
                        # fails to import on this machine: the other methods still run)
                        run = f"failed to set up: {type(error).__name__}: {str(error)[:160]}"
                    slow = too_slow.get((kind, dtype_name, name))
                    if isinstance(run, str) or slow:
                        _row(args.table, kind, n, dtype_name, name, run if isinstance(run, str)
                             else f"not run: {slow}", "", "", "", "", "")
                        continue
                    try:
                        with torch.inference_mode():
                            ms, peak, out, first = _measure(
                                lambda run=run, q=q, k=k, v=v: run(q, k, v), args.repeats,
                                device, args.slow_s)
                    except Exception as error:  # noqa: BLE001  (out of memory, a kernel that
                        # does not compile at this size...): the row says so, the rest runs
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                        too_slow[(kind, dtype_name, name)] = f"failed at n={n}"
                        _row(args.table, kind, n, dtype_name, name,
                             f"failed: {type(error).__name__}: {str(error)[:160]}", "", "", "",
                             "", "")
                        continue
                    if first > args.slow_s:
                        too_slow[(kind, dtype_name, name)] = f"{first:.0f} s a call at n={n}"
                    if name.startswith("check") or name == "select":  # no attention output
                        _row(args.table, kind, n, dtype_name, name, f"{ms:.2f}", f"{peak:.1f}",
                             "", "", "", "")
                        del out
                        continue
                    diff = float((out.float() - reference).abs().max())
                    sel, off = recalls[dtype_name] if name.startswith("block") else (1.0, 0.0)
                    certified = f"{args.certified:.4f}" if name.endswith("-exact") else ""
                    _row(args.table, kind, n, dtype_name, name, f"{ms:.2f}", f"{peak:.1f}",
                         f"{diff:.2e}", f"{sel:.4f}", f"{off:.4f}", certified)
                    headline[(kind, n, dtype_name, name)] = (ms, diff, sel)
                    del out
    kind, n = args.inputs[0], max(args.sizes)
    dtype_name = "fp16" if "fp16" in args.dtypes else args.dtypes[0]

    def ms(name: str) -> float:
        return headline.get((kind, n, dtype_name, name), (math.nan,))[0]

    block = headline.get((kind, n, dtype_name, "block"), (math.nan, math.nan, math.nan))
    exact = headline.get((kind, n, dtype_name, "block-exact"), (math.nan, math.nan, math.nan))
    print(f"device={device.type} n={n} block_vs_sdpa={ms('sdpa') / block[0]:.3f} "
          f"block_vs_adasplash={ms('adasplash') / block[0]:.3f} block_recall={block[2]:.4f} "
          f"exact_max_diff={exact[1]:.3e} triton_vs_sdpa={ms('sdpa') / ms('block-triton'):.3f} "
          f"triton_vs_adasplash={ms('adasplash') / ms('block-triton'):.3f}")
    return 0


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool):  # noqa: ANN202
    """Exact 1.5-entmax attention in float32, tile by tile: (support bits, output)."""
    from sparsefinder.attention.gold_edges import entmax_edges

    return entmax_edges(q, k, q.shape[-1] ** -0.5, value=v, causal=causal, form="bits",
                        max_edge_mib=1 << 20, budget_mib=4096 if q.is_cuda else 256)


if __name__ == "__main__":
    raise SystemExit(main())
