"""Block-sparse entmax attention (block Sparsefinder) against dense attention, n = 1024…8192.

Run under the shared lock (the machine has 2 cores):
``flock /tmp/sparsefinder-bench.lock .venv/bin/python benchmarks/restricted.py``.

**Inputs: real q/k.** Random Gaussian q/k have no block structure, so the default model's
own vectors are used: the VALIDATION passages of the default corpus (held out from the
bundled projections' training) are joined into one long document, tokenized, cut into
consecutive 510-token windows (+ [CLS]/[SEP] = 512, the model's limit), and each window is
run through all-MiniLM-L6-v2 with entmax-1.5 attention; the q/k of one layer (``--layer``,
default 2; 12 heads × 32 dims) of consecutive windows are concatenated to n tokens. Within a
window these are exactly the model's vectors; across windows the scores are those of real
vectors from other positions of the same document (as a longer-context model would see more
of it). The validation split covers n ≤ 4096; a longer n falls back to every passage (train
included), and the header says which split each n used. Values v are Gaussian (timings do
not depend on them). All methods get the same q/k/v, fp32, one 12-head layer,
bidirectional, ``torch.inference_mode``.

**Methods** (each a full attention layer: scores → normalisation → ``probs @ v``):

* ``block-sparsefinder`` — a selection of keys per query block of ``--block`` = 32 queries,
  then :func:`~sparsefinder.attention.block_sparse.block_sparse_entmax` on it. Its time
  INCLUDES predicting the selection (``predict``). ``--selector keys`` (the default):
  :class:`~sparsefinder.predictors.block_keys.BlockKeySparsefinder` — the diagonal block
  (``--window-blocks`` = 1) ∪ the ``--n-keys`` = 448 single keys with the highest
  ``max_s q̄_s · k`` over the block's sub-blocks of ``--sub-block`` = 8 queries (q̄_s their
  mean; the model's own q/k): 480 of 4096 keys a query. Chosen on TRAIN-split q/k at
  n = 4096, layers 1-4 (``tools/choose_block_keys.py``: among settings at ≥ 6× SDPA in the
  same process, the best mean exact rows; key blocks and global keys lost to single keys at
  the same budget), not on these inputs. The earlier selectors stay available:
  ``--selector learned``/``auto``/``pooled`` pick ``--n-blocks`` = 4 key blocks per query
  block from the learned block projections
  (:class:`~sparsefinder.predictors.block.LearnedBlockSparsefinder`,
  ``assets/default/block_projections-b{16,32}.pt``; ``auto`` when bundled for ``--block``)
  or from the pooled rank-4 token projections, plus ``--n-keys`` = 256 single keys by the
  token projections and the diagonal band of 3 blocks;
* ``entmax15 full sort`` — ``entmax.entmax15(scores)`` (sorts every row);
* ``entmax15 k=64`` — ``entmax.entmax15(scores, k=64)`` (partial sort, the package's option);
* ``entmax15 fast dense`` — sparsefinder's sort-free dense solver, for information;
* ``sdpa softmax`` — ``torch.nn.functional.scaled_dot_product_attention`` (fused, no scores).

**Threads.** Every method runs with the same ``--threads`` (default 1) and the same glibc
malloc tuning (:func:`sparsefinder.runtime.tune_cpu_allocator`). One thread by default
because this 2-core machine is shared: with 2 OpenMP threads and other jobs running, the
threads' barrier spinning inflated the many small operations of the block-sparse path 3-10×
from run to run (measured 0.44-4.3 s for the same call), while big dense kernels suffered
less; ``--threads 2`` measures that configuration on a quiet machine.

**Memory, honestly.** tracemalloc misses torch's allocations, so each measurement runs in
its own fresh process: it loads the inputs, warms the method up once on the first 512
tokens, resets the peak RSS (``/proc/self/clear_refs`` ← 5), runs, and reports ``VmHWM -
VmRSS at reset`` — every byte the kernel had to back during the call, whoever allocated it.
Seconds are the median of ``--repeats`` runs (one run when a run takes > 5 s). A dense
method whose memory, extrapolated from the smaller n, exceeds 80% of MemAvailable is
skipped with that estimate instead of being killed for memory.

**Quality** of the predicted selection at each n: edge recall (gold edges computed) and
exact fraction (query rows whose whole gold support is computed, which by sparse-consistency
get exactly full entmax's output), against gold edges from the bounded extraction
(:func:`sparsefinder.attention.gold_edges.entmax_edges`). ``--no-quality`` skips it;
``--quality-only`` measures it without timing anything.

Last line (n = 4096): ``vs_full=<x> vs_k64=<y> extra_mib=<z> n8192_ok=<0|1> recall=<r>
exact_rows=<e> vs_sdpa=<s>``, ratios = their seconds / ours; recall and exact rows of the
selection at n = 4096 (or, when 4096 is not among ``--sizes``, at the largest n measured).
``--device cuda`` on a machine without a GPU skips with the reason. ``--smoke``: n = 512, one
repeat, the block-sparse method and the package's sort.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import cuda_missing, parse, parser, skip  # noqa: E402

METHODS = ("block-sparsefinder", "entmax15 full sort", "entmax15 k=64", "entmax15 fast dense",
           "sdpa softmax")
DENSE = {"entmax15 full sort", "entmax15 k=64", "entmax15 fast dense"}
SIZES = (1024, 2048, 4096, 8192)
#: ``--selector keys`` defaults, chosen on TRAIN-split q/k (tools/choose_block_keys.py).
KEYS_DEFAULT = {"n_keys": 448, "sub_block": 8, "window_blocks": 1}
WINDOW = 512


# ---------------------------------------------------------------------------- inputs


def real_qk(layer: int, n_max: int, split: str = "validation"
            ) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(q, k) (12, n_max, 32) of one layer over consecutive 512-token windows."""
    from sparsefinder.attention.interface import capture
    from sparsefinder.data.corpus import default_corpus
    from sparsefinder.models.loading import load_model

    loaded = load_model("default", alpha=1.5, device="cpu")
    tok = loaded.tokenizer
    source = split
    ids = tok(" ".join(default_corpus(split)), add_special_tokens=False)["input_ids"]
    if len(ids) < n_max:  # a small validation split: fall back to every passage
        source = "all"
        ids = tok(" ".join(default_corpus("all")), add_special_tokens=False)["input_ids"]
    body = WINDOW - 2
    qs, ks = [], []
    total = 0
    for start in range(0, len(ids), body):
        window = [tok.cls_token_id, *ids[start : start + body], tok.sep_token_id]
        calls = []
        with torch.inference_mode(), capture(calls.append):
            loaded.model(input_ids=torch.tensor([window]))
        qs.append(calls[layer].query[0].float())
        ks.append(calls[layer].key[0].float())
        total += len(window)
        if total >= n_max:
            break
    q, k = torch.cat(qs, 1)[:, :n_max].contiguous(), torch.cat(ks, 1)[:, :n_max].contiguous()
    if q.shape[1] < n_max:
        raise SystemExit(f"the corpus has only {q.shape[1]} tokens, fewer than n={n_max}")
    return q, k, f"{source} split, {len(qs)} windows"


# ---------------------------------------------------------------------------- one method


def _inputs(layer: int, sizes: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor, str]]:
    """n → (q, k, source) for every size: the VALIDATION split wherever it is long enough
    (one capture serves every smaller n), every passage beyond that."""
    out: dict[int, tuple[torch.Tensor, torch.Tensor, str]] = {}
    for n in sorted(sizes, reverse=True):
        if n in out:
            continue
        q, k, source = real_qk(layer, n)
        if source.startswith("validation"):
            out.update({m: (q, k, source) for m in sizes if m <= n})
        out[n] = (q, k, source)
    return out


def _rss(field: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _runner(method: str, args: argparse.Namespace, layer: int):
    """A function (q, k, v) → (output, predict seconds) for one method."""
    import torch.nn.functional as F
    from entmax import entmax15

    from sparsefinder.attention.block_sparse import block_sparse_entmax
    from sparsefinder.attention.entmax_ops import entmax_normalize

    if method == "block-sparsefinder":
        select = _selector(args, layer)

        def run(q, k, v):
            start = time.perf_counter()
            graph, extra = select(q, k)
            if q.is_cuda:  # count the selection's kernels, not only their launch
                torch.cuda.synchronize(q.device)
            predicted = time.perf_counter() - start
            out = block_sparse_entmax(q, k, v, graph, args.block, extra_keys=extra)
            return out, predicted

        return run

    def scores(q, k):
        return torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)

    if method == "sdpa softmax":
        return lambda q, k, v: (F.scaled_dot_product_attention(q, k, v), 0.0)
    normalise = {
        "entmax15 full sort": lambda s: entmax15(s, dim=-1),
        "entmax15 k=64": lambda s: entmax15(s, dim=-1, k=64),
        "entmax15 fast dense": lambda s: entmax_normalize(s, 1.5),
    }[method]
    return lambda q, k, v: (torch.matmul(normalise(scores(q, k)), v), 0.0)


def _selector_name(args: argparse.Namespace) -> str:
    """``auto`` → ``learned`` when block projections for ``--block`` are bundled."""
    if args.selector != "auto":
        return args.selector
    from sparsefinder.projections.blocks import bundled_block_projections_path

    path = bundled_block_projections_path(args.block)
    return "learned" if path is not None and path.is_file() else "pooled"


def _n_keys(args: argparse.Namespace) -> int:
    """``--n-keys``, or its default for the selector."""
    if getattr(args, "n_keys", None) is not None:
        return args.n_keys
    return KEYS_DEFAULT["n_keys"] if args.selector == "keys" else 256


def keys_selector(block: int, n_keys: int | None = None, sub_block: int | None = None,
                  window_blocks: int | None = None, candidates: int = 0, wide_keys: int = 0):
    """(q, k) → (block graph, extra keys) of the default block Sparsefinder (the diagonal band
    ∪ single keys by q·k on pooled query sub-blocks), at :data:`KEYS_DEFAULT` where a setting
    is not given: shared by the benchmarks that compare against it. ``candidates`` > 0: the
    second stage re-ranks that many pooled candidates by the block's own queries;
    ``wide_keys`` > 0: its crowded blocks keep that many."""
    from sparsefinder.predictors.block_keys import BlockKeySparsefinder

    return BlockKeySparsefinder(block, n_keys or KEYS_DEFAULT["n_keys"],
                                sub_block=sub_block or KEYS_DEFAULT["sub_block"],
                                window_blocks=window_blocks or KEYS_DEFAULT["window_blocks"],
                                candidates=candidates, wide_keys=wide_keys).select


def second_stage(candidates: int, wide_keys: int) -> str:
    """How the keys selector's second stage is set, for a benchmark's header ("" without)."""
    if not candidates:
        return ""
    return (f"{candidates} candidates re-ranked by each block's queries"
            + (f", crowded blocks keep {wide_keys}" if wide_keys else ""))


def _selector(args: argparse.Namespace, layer: int):
    """(q, k) → (block graph, extra keys) of the block Sparsefinder. ``--selector keys``: the
    diagonal band ∪ single keys by q·k on pooled query sub-blocks (``BlockKeySparsefinder``);
    otherwise key blocks from the pooled token projections (``pooled``) or from the learned
    block projections (``learned``) and single keys from the token projections."""
    if args.selector == "keys":
        return keys_selector(args.block, _n_keys(args), getattr(args, "sub_block", None),
                             getattr(args, "window_blocks", None),
                             getattr(args, "candidates", 0), getattr(args, "wide_keys", 0))

    from sparsefinder.bundle import bundle
    from sparsefinder.predictors.block import BlockSparsefinder, LearnedBlockSparsefinder
    from sparsefinder.projections.heads import HeadProjections

    projections = HeadProjections.load(bundle().path("projections.pt"))
    predictor = BlockSparsefinder(args.block, args.n_blocks, _n_keys(args), window_blocks=2)
    learned = None
    if _selector_name(args) == "learned":
        from sparsefinder.projections.blocks import bundled_block_projections

        blocks = bundled_block_projections(block=args.block)
        if blocks is None:
            raise SystemExit(f"no bundled block projections for --block {args.block}; "
                             "use --block 16 or 32 (or --selector pooled)")
        learned = LearnedBlockSparsefinder(blocks.weight[layer].to(args.device), args.block,
                                           args.n_blocks,
                                           window_blocks=2)

    def select(q, k):
        graph = learned.predict_blocks(q, k) if learned is not None else None
        return predictor.select(projections.project_queries(layer, q),
                                projections.project_keys(layer, k), graph=graph)

    return select


def child(args: argparse.Namespace) -> None:
    """Measure one (method, n) in this fresh process; print one JSON line.

    On a CPU the memory is the process's peak RSS growth (every byte the kernel backed); on a
    GPU (``--device cuda``) it is the CUDA allocator's peak over the call, and each timing is
    bracketed by ``torch.cuda.synchronize`` so it counts the kernels, not their launch.
    """
    from sparsefinder.runtime import tune_cpu_allocator

    tune_cpu_allocator()  # every method alike, as the CLI and benchmarks/extract.py do
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    data = torch.load(args.data, weights_only=True)
    n = args.n
    q, k, v = (data[name][:, :n].contiguous().to(device) for name in ("q", "k", "v"))
    run = _runner(args.child, args, data["layer"])
    with torch.inference_mode():
        run(q[:, :WINDOW], k[:, :WINDOW], v[:, :WINDOW])  # warm-up: lazy init, kernels
        sync()
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device) / 2**20
        else:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            base = _rss("VmRSS")
        times, predicts = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            out, predicted = run(q, k, v)
            sync()
            times.append(time.perf_counter() - start)
            predicts.append(predicted)
            del out
            if times[-1] > 5:
                break
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if on_gpu else _rss("VmHWM")
    print(json.dumps({"seconds": statistics.median(times), "predict": statistics.median(predicts),
                      "extra_mib": peak - base, "runs": len(times)}))


def measure(method: str, n: int, data: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", method, "--n", str(n), "--data", str(data),
               "--repeats", str(args.repeats), "--threads", str(args.threads),
               "--block", str(args.block),
               "--n-blocks", str(args.n_blocks), "--n-keys", str(_n_keys(args)),
               "--sub-block", str(args.sub_block), "--window-blocks", str(args.window_blocks),
               "--candidates", str(args.candidates), "--wide-keys", str(args.wide_keys),
               "--selector", args.selector,
               "--device", args.device]
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["killed"])[-1][:120]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _available_mib(device: str = "cpu") -> float:
    """Memory a method may still take: the GPU's free memory, or the host's MemAvailable."""
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0] / 2**20
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


# ---------------------------------------------------------------------------- quality


def quality(q: torch.Tensor, k: torch.Tensor, layer: int, args: argparse.Namespace
            ) -> tuple[float, float, float]:
    """(edge recall, exact fraction, gold density) of the predicted selection."""
    from sparsefinder.attention.gold_edges import entmax_edges

    with torch.inference_mode():
        graph, extra = _selector(args, layer)(q, k)
        edges, _ = entmax_edges(q, k, q.shape[-1] ** -0.5)
    recall, exact = score_selection(graph, extra, edges, args.block)
    return recall, exact, edges.density


def score_selection(graph: torch.Tensor, extra: torch.Tensor | None, edges, block: int
                    ) -> tuple[float, float]:
    """(edge recall, exact fraction) of a (block graph, extra keys) selection against gold
    edges (:class:`~sparsefinder.attention.gold_edges.GoldEdges`, self-attention)."""
    heads, n = edges.heads, edges.n
    counts = edges.row_counts().view(-1)
    rows = torch.repeat_interleave(torch.arange(heads * n), counts)
    head, query = rows // n, rows % n
    keys = edges.indices.long()
    hit = graph[head, query // block, keys // block]
    if extra is not None:  # (heads, nb, G): is the key among its query block's extra keys?
        per_block = torch.zeros(heads, graph.shape[1], n, dtype=torch.bool)
        per_block.scatter_(-1, extra, True)
        hit = hit | per_block[head, query // block, keys]
    missed_rows = torch.zeros(heads * n, dtype=torch.int64).index_add_(0, rows, (~hit).long())
    exact = float((missed_rows == 0).double().mean())
    return float(hit.double().mean()), exact


# ---------------------------------------------------------------------------- main


def main() -> None:
    made = parser(__doc__.split("\n")[0])
    made.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    made.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                      help="the methods to time (default: all)")
    made.add_argument("--layer", type=int, default=2)
    made.add_argument("--block", type=int, default=32)
    made.add_argument("--n-blocks", type=int, default=4)
    made.add_argument("--n-keys", type=int, default=None,
                        help=f"single keys per query block (default {KEYS_DEFAULT['n_keys']} "
                             "for --selector keys, 256 otherwise)")
    made.add_argument("--sub-block", type=int, default=KEYS_DEFAULT["sub_block"],
                        help="--selector keys: queries pooled per sub-block when scoring keys")
    made.add_argument("--window-blocks", type=int, default=KEYS_DEFAULT["window_blocks"],
                        help="--selector keys: diagonal band half-width in blocks")
    made.add_argument("--candidates", type=int, default=0,
                        help="--selector keys: pooled candidates the second stage re-ranks by "
                             "each block's own queries (0: the pooled stage alone)")
    made.add_argument("--wide-keys", type=int, default=0,
                        help="--selector keys with --candidates: single keys a crowded query "
                             "block keeps instead of --n-keys (0: none widened)")
    made.add_argument("--selector", choices=["keys", "auto", "pooled", "learned"],
                        default="keys",
                        help="keys (default): the diagonal band and single keys scored by q·k on "
                             "pooled query sub-blocks; the others: key blocks from the bundled "
                             "projections learned on pooled blocks (learned; auto: when bundled "
                             "for --block) or from pooled token projections (pooled), plus "
                             "--n-keys single keys from the rank-4 token projections")
    made.add_argument("--repeats", type=int, default=3)
    made.add_argument("--threads", type=int, default=1)
    made.add_argument("--no-quality", action="store_true")
    made.add_argument("--quality-only", action="store_true",
                        help="measure the selection's edge recall and exact rows only")
    made.add_argument("--qk", help="q/k saved by benchmarks/gpu_solver.py --save (layer 2, "
                        "n up to 8192) instead of running the model")
    made.add_argument("--device", default="cpu",
                        help="where every method runs (cpu, or cuda on a GPU machine); the "
                             "inputs are captured on the CPU either way")
    made.add_argument("--child", choices=METHODS)
    made.add_argument("--n", type=int)
    made.add_argument("--data")
    args = parse(made, smoke={"sizes": [WINDOW], "repeats": 1,
                              "methods": ["block-sparsefinder", "entmax15 full sort"]})
    if args.child:
        child(args)
        return
    missing = cuda_missing(args.device)
    if missing:
        skip(missing, vs_full="nan", vs_k64="nan", vs_sdpa="nan")
        return

    print(f"device {args.device}; load avg {os.getloadavg()[0]:.2f} (over {os.cpu_count()} "
          "cores), torch threads "
          f"{args.threads} for every method, glibc malloc tuned for every method")
    if args.qk:  # saved q/k (benchmarks/gpu_solver.py --save): no model needed here
        saved = torch.load(args.qk, weights_only=True)
        inputs = {n: (saved["q"], saved["k"], f"saved q/k from {args.qk}") for n in args.sizes}
    else:
        inputs = _inputs(args.layer, sorted(args.sizes))
    if args.selector == "keys":
        setting = (f"selector keys: band of {2 * args.window_blocks - 1} blocks + "
                   f"{_n_keys(args)} single keys by q.k on sub-blocks of {args.sub_block} queries"
                   + (f", {second_stage(args.candidates, args.wide_keys)}"
                      if args.candidates else ""))
    else:
        setting = (f"n_blocks={args.n_blocks}, n_keys={_n_keys(args)}, diagonal band of 3 "
                   f"blocks, key blocks by the {_selector_name(args)} projections")
    sources = ", ".join(f"n={n}: {inputs[n][2]}" for n in sorted(args.sizes))
    print(f"inputs: all-MiniLM-L6-v2 layer {args.layer} q/k (12 heads x 32), default corpus "
          f"concatenated ({sources}); block={args.block}, {setting}")
    results: dict[tuple[int, str], dict] = {}
    per_score: dict[str, float] = {}  # MiB per score of each dense method, largest n so far
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted(args.sizes):
            q, k, _ = inputs[n]
            q, k = q[:, :n].contiguous(), k[:, :n].contiguous()
            v = torch.randn(q.shape, generator=torch.Generator().manual_seed(0))
            data = Path(tmp) / f"qkv{n}.pt"
            torch.save({"q": q, "k": k, "v": v, "layer": args.layer}, data)
            for method in () if args.quality_only else args.methods:
                scores = 12 * n * n
                if method in per_score:
                    need = per_score[method] * scores
                    if need > 0.8 * _available_mib(args.device):
                        results[n, method] = {"skipped": f"needs ~{need / 1024:.0f} GiB"}
                        continue
                result = measure(method, n, data, args)
                results[n, method] = result
                if method in DENSE and "extra_mib" in result:
                    per_score[method] = result["extra_mib"] / scores
            if not args.no_quality:
                recall, exact, density = quality(q, k, args.layer, args)
                results[n, "quality"] = {"recall": recall, "exact": exact,
                                         "density": density}
    print(f"{'n':>5}  {'method':<20}{'seconds':>9}{'predict':>9}{'extra MiB':>11}"
          f"{'their s / ours':>16}")
    for n in sorted(args.sizes):
        ours = results.get((n, "block-sparsefinder"), {}).get("seconds")
        for method in () if args.quality_only else args.methods:
            r = results[n, method]
            if "seconds" not in r:
                print(f"{n:>5}  {method:<20}{r.get('skipped') or r.get('error')}")
                continue
            ratio = f"{r['seconds'] / ours:>15.2f}x" if ours else ""
            print(f"{n:>5}  {method:<20}{r['seconds']:>9.3f}{r['predict']:>9.3f}"
                  f"{r['extra_mib']:>11.0f}{ratio}")
        if (n, "quality") in results:
            qd = results[n, "quality"]
            print(f"{n:>5}  quality: edge recall {qd['recall']:.4f}, exact rows "
                  f"{qd['exact']:.4f}, gold density {qd['density']:.4f}")
    print(f"load avg after: {os.getloadavg()[0]:.2f}")
    at_n = 4096 if 4096 in args.sizes else max(args.sizes)
    if at_n != 4096:
        print(f"the last line is at n={at_n} (4096 was not measured)")
    at = {m: results.get((at_n, m), {}) for m in METHODS}
    ours = at["block-sparsefinder"].get("seconds", float("nan"))
    vs_full = at["entmax15 full sort"].get("seconds", float("nan")) / ours
    vs_k64 = at["entmax15 k=64"].get("seconds", float("nan")) / ours
    extra = at["block-sparsefinder"].get("extra_mib", float("nan"))
    n8192_ok = int("seconds" in results.get((8192, "block-sparsefinder"), {}))
    vs_sdpa = at["sdpa softmax"].get("seconds", float("nan")) / ours
    qd = results.get((at_n, "quality"), {})
    recall, exact = qd.get("recall", float("nan")), qd.get("exact", float("nan"))
    print(f"vs_full={vs_full:.2f} vs_k64={vs_k64:.2f} extra_mib={extra:.0f} n8192_ok={n8192_ok} "
          f"recall={recall:.4f} exact_rows={exact:.4f} vs_sdpa={vs_sdpa:.2f}")


if __name__ == "__main__":
    main()
