"""How many candidates the block-keys selector's second stage re-ranks, chosen on TRAIN only.

Inputs: q/k of the default model, layers 1-4, over consecutive 512-token windows of the
default corpus' TRAIN split concatenated to n tokens (``restricted.real_qk(..., "train")``);
gold entmax-1.5 edges. The selector is the long-context default (block 32, the diagonal band,
448 single keys from pooled sub-blocks of 8 queries) with ``candidates`` C, C = 0 being the
pooled stage alone. For each n it reports, per layer, edge recall / exact rows and the
selection's seconds (one thread), and how many gold keys a query block needs outside its band
(mean and largest: the budget an oracle would need).

Rule, fixed before looking: for each n, the smallest C of the grid whose mean edge recall over
the four layers is at least 0.99 (the recall at which the long-context issue compares speed).

    PYTHONPATH=. .venv/bin/python tools/choose_candidates.py [--sizes 4096 8192]

About ten minutes on two cores. The validation split is read only by ``--split validation``.
``--wide-keys W``: every C > 0 of the grid with crowded blocks keeping ``W`` (the selector of
``benchmarks/gpu_attention.py``), e.g. at the GPU's lengths, about half an hour:

    PYTHONPATH=. .venv/bin/python tools/choose_candidates.py --sizes 16384 32768 \
        --grid 3072 4096 6144 --wide-keys 1024

``--wide W``: instead, how crowded a query block must be to keep ``W`` keys
(``BlockKeySparsefinder.wide_keys``; the second stage at ``--candidates``, default 2048). For
each crowd share of the grid (a block is crowded when more than 448 times the share of its
candidates lie within ``CROWD_GAP`` of a row maximum) it reports per layer edge recall /
exact rows and the share of blocks widened, next to no block widened and every block widened.
Rule, fixed after a first look at TRAIN numbers: the largest share that, at every n, recovers
at least three quarters of the recall that widening every block gains (fewer wide blocks is
cheaper: each is a wider, slower program).

    PYTHONPATH=. .venv/bin/python tools/choose_candidates.py --wide 1024

``--pooling``: instead, how finely the pooled stage pools its queries (``sub_block``) and how
many candidates it passes on, with crowded blocks keeping 1024. For each (sub_block,
candidates) pair of the grid it reports per layer edge recall, the mean exact rows and the
selection's seconds (one thread, layer mean). Rule, fixed after a first look at TRAIN numbers:
the pair with the fewest seconds at the largest n among those whose mean edge recall is at
least 0.99 at every n.

    PYTHONPATH=. .venv/bin/python tools/choose_candidates.py --pooling

``--budgets``: instead, the keys a query block keeps at the GPU's lengths, where 448 single
keys fall short (TRAIN q/k at n = 16 384 and 32 768: a block needs 204-388 gold keys outside its
band on average, up to 1500). For each (n_keys, wide_keys, candidates) of the grid (sub-blocks
of 8) it reports per layer edge recall, the mean exact rows and the selection's seconds. Rule,
fixed before looking at the grid's numbers (after the candidates grid above at those n): for
each n, the setting with the fewest single keys, then the fewest candidates, whose mean edge
recall is at least 0.99; where none is, the one with the highest, reported as short of it.

    PYTHONPATH=. .venv/bin/python tools/choose_candidates.py --budgets --sizes 16384 32768

``--precision``: instead, whether the chosen selector (sub-blocks of 8, 3072 candidates,
crowded blocks keeping 1024) may read half q/k, as a GPU's fp16 or bf16 attention holds them:
both stages then multiply in half (the selection's seconds on a CPU say nothing of a GPU's).
For float32, fp16 and bf16 it reports per layer edge recall and the mean exact rows. Rule,
fixed before looking: a half format is used where its mean edge recall is at most 0.001 under
float32's at every n. ``--split validation`` reports the same table on the validation split
(every passage where it is shorter than n) once the choice is made; it chooses nothing.

    PYTHONPATH=. .venv/bin/python tools/choose_candidates.py --precision [--split validation]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

LAYERS = (1, 2, 3, 4)
GRID = (0, 640, 896, 1024, 1280, 1536, 2048)
BAR = 0.99
SHARES = (1 / 2, 1 / 3, 1 / 4)
GAIN = 0.75
POOLING = ((8, 2048), (8, 3072), (4, 2048), (4, 3072), (2, 2048))
HALF_LOSS = 0.001
BUDGETS = ((448, 1024, 6144), (640, 1280, 6144), (896, 1792, 6144), (896, 1792, 8192))


def gold_union(edges, block: int) -> tuple[float, int]:
    """(mean, largest) count of distinct gold keys per (head, query block) outside its
    diagonal block."""
    heads, n = edges.heads, edges.n
    counts = edges.row_counts().view(-1)
    rows = torch.repeat_interleave(torch.arange(heads * n), counts)
    head, query = rows // n, rows % n
    keys = edges.indices.long()
    off = (keys // block) != (query // block)
    nb = -(-n // block)
    used = torch.zeros(heads * nb, n, dtype=torch.bool)
    used[(head * nb + query // block)[off], keys[off]] = True
    per_block = used.sum(-1).float()
    return float(per_block.mean()), int(per_block.max())


Row = tuple[float, float, float, float]  # edge recall, exact rows, select seconds, widened


def measure(n: int, settings: dict, on_edges=None, split: str = "train") -> dict:  # noqa: ANN001
    """setting → one :data:`Row` per layer of :data:`LAYERS`, on ``split`` q/k at ``n``; each
    setting a function returning the ``select`` to time (it may set module state first);
    ``on_edges(edges)`` sees each layer's gold edges. Widened: the share of query blocks
    keeping more than 448 distinct single keys."""
    import restricted

    from sparsefinder.attention.gold_edges import entmax_edges

    rows: dict = {}
    for layer in LAYERS:
        q, k, source = restricted.real_qk(layer, n, split)
        with torch.inference_mode():
            edges, _ = entmax_edges(q, k, q.shape[-1] ** -0.5)
            if on_edges is not None:
                on_edges(edges)
            for name, make in settings.items():
                select = make()
                start = time.perf_counter()
                graph, extra = select(q, k)
                seconds = time.perf_counter() - start
                distinct = (extra.sort(-1).values.diff(dim=-1) != 0).sum(-1) + 1
                rows.setdefault(name, []).append(
                    (*restricted.score_selection(graph, extra, edges, 32), seconds,
                     float((distinct > 448).double().mean())))
        print(f"n={n} layer {layer} done ({source})", flush=True)
    return rows


def mean(cells: list[Row], field: int) -> float:
    """The layer mean of one field of the rows."""
    return sum(cell[field] for cell in cells) / len(cells)


def print_table(title: str, label: str, rows: dict, seconds: bool = True) -> None:
    """One table of the settings' :data:`Row` lists: per layer edge recall, the means of
    recall and exact rows, and (``seconds``) the layer mean of the selection's seconds. A
    setting's label is its key, a tuple joined by " / "."""
    print(f"\n{title}")
    print(f"| {label} | " + " | ".join(f"layer {x}" for x in LAYERS) + " | mean recall | "
          "mean exact |" + (" select s |" if seconds else ""))
    print("|---" * (len(LAYERS) + 3 + seconds) + "|")
    for key, cells in rows.items():
        name = " / ".join(map(str, key)) if isinstance(key, tuple) else key
        print(f"| {name} | " + " | ".join(f"{r:.4f}" for r, _, _, _ in cells)
              + f" | {mean(cells, 0):.4f} | {mean(cells, 1):.3f} |"
              + (f" {mean(cells, 2):.3f} |" if seconds else ""), flush=True)


def selector(**settings):  # noqa: ANN003, ANN201
    """A setting of :func:`measure`: the long-context selector with these changes."""
    from sparsefinder.predictors.block_keys import BlockKeySparsefinder

    return lambda: BlockKeySparsefinder(**{"block": 32, "n_keys": 448, "sub_block": 8,
                                           **settings}).select


def main() -> None:
    made = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    made.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    made.add_argument("--grid", type=int, nargs="+", default=list(GRID))
    made.add_argument("--wide", type=int, default=0, help="choose the crowd share instead")
    made.add_argument("--candidates", type=int, default=2048)
    made.add_argument("--wide-keys", type=int, default=0,
                      help="choosing candidates: crowded blocks keep this many (0: off)")
    made.add_argument("--pooling", action="store_true",
                      help="choose the pooled stage's sub-block and candidates instead")
    made.add_argument("--budgets", action="store_true",
                      help="choose the keys a block keeps at long n instead")
    made.add_argument("--precision", action="store_true",
                      help="whether the selector may read half q/k instead")
    made.add_argument("--split", choices=["train", "validation"], default="train",
                      help="with --precision: validation only reports, once chosen")
    args = made.parse_args()
    torch.set_num_threads(1)
    if args.split != "train" and not args.precision:
        made.error("--split validation only reports --precision; the choices read train")
    print(f"load avg {os.getloadavg()[0]:.2f}; {args.split} split, one thread", flush=True)
    if args.budgets:
        choose_budgets(args.sizes)
    elif args.precision:
        choose_precision(args.sizes, args.split)
    elif args.pooling:
        choose_pooling(args.sizes)
    elif args.wide:
        choose_crowd(args.sizes, args.wide, args.candidates)
    else:
        choose_candidates(args.sizes, args.grid, args.wide_keys)
    print(f"load avg {os.getloadavg()[0]:.2f}")


def choose_candidates(sizes: list[int], grid: list[int], wide_keys: int = 0) -> None:
    """The second stage's candidates by the module docstring's rule."""
    for n in sizes:
        unions: list[tuple[float, int]] = []
        quality = measure(n, {count: selector(candidates=count, wide_keys=wide_keys if count
                                              else 0) for count in grid},
                          on_edges=lambda edges, found=unions: found.append(gold_union(edges, 32)))
        print(f"\nn = {n}: gold keys a query block needs outside its band, mean / largest: "
              + ", ".join(f"layer {x} {m:.0f} / {b}" for x, (m, b) in zip(LAYERS, unions,
                                                                        strict=True)))
        print("| candidates | " + " | ".join(f"layer {x} recall / exact" for x in LAYERS)
              + " | mean recall | mean exact | select s (layer mean) |")
        print("|---" * (len(LAYERS) + 4) + "|")
        for count, rows in quality.items():
            cells = " | ".join(f"{r:.3f} / {e:.3f}" for r, e, _, _ in rows)
            print(f"| {count or 'off'} | {cells} | {mean(rows, 0):.4f} | {mean(rows, 1):.3f} | "
                  f"{mean(rows, 2):.3f} |")
        met = [c for c, rows in quality.items() if mean(rows, 0) >= BAR]
        print(f"chosen at n={n} (smallest with mean recall >= {BAR}): "
              f"{min(met) if met else 'none of the grid'}", flush=True)


def choose_crowd(sizes: list[int], wide: int, candidates: int) -> None:
    """The crowd share of ``block_keys.CROWD_SHARE`` by the module docstring's rule."""
    from sparsefinder.predictors import block_keys

    def shared(share: float):  # noqa: ANN202
        def make():  # noqa: ANN202
            block_keys.CROWD_SHARE = share
            return selector(candidates=candidates, wide_keys=wide)()
        return make

    settings = {"off": selector(candidates=candidates),
                **{f"1/{round(1 / s)}": shared(s) for s in SHARES},
                "every block": selector(n_keys=wide, candidates=candidates)}
    gains: dict[str, list[float]] = {}
    for n in sizes:
        rows = measure(n, settings)
        print(f"\nn = {n}, {candidates} candidates, wide blocks keep {wide}:")
        print("| crowd share | " + " | ".join(f"layer {x} recall / exact / widened"
                                              for x in LAYERS) + " | mean recall |")
        print("|---" * (len(LAYERS) + 2) + "|")
        for name, cells in rows.items():
            print(f"| {name} | " + " | ".join(f"{r:.4f} / {e:.3f} / {w:.3f}"
                                              for r, e, _, w in cells)
                  + f" | {mean(cells, 0):.4f} |")
        span = mean(rows["every block"], 0) - mean(rows["off"], 0)
        for name in rows:
            if name not in ("off", "every block"):
                gains.setdefault(name, []).append(
                    (mean(rows[name], 0) - mean(rows["off"], 0)) / span if span > 0 else 1.0)
    met = [name for name, got in gains.items() if min(got) >= GAIN]
    print("share of the gain of widening every block: " + ", ".join(
        f"{name} {min(got):.2f}" for name, got in gains.items()))
    print(f"chosen (the largest share recovering >= {GAIN} of the gain at every n): "
          f"{met[0] if met else 'none of the grid'}", flush=True)


def choose_pooling(sizes: list[int]) -> None:
    """The pooled stage's (sub_block, candidates) by the module docstring's rule."""
    results = {}
    for n in sizes:
        results[n] = rows = measure(n, {
            (sub, count): selector(sub_block=sub, candidates=count, wide_keys=1024)
            for sub, count in POOLING})
        print_table(f"n = {n}, crowded blocks keep 1024:", "sub_block / candidates", rows)
    largest = max(sizes)
    met = [pair for pair in POOLING if all(mean(results[n][pair], 0) >= BAR for n in sizes)]
    cost = {pair: mean(results[largest][pair], 2) for pair in met}
    best = min(cost, key=cost.get) if cost else None
    print(f"chosen (the fewest seconds at n={largest} with mean recall >= {BAR} at every n): "
          + (f"sub_block {best[0]}, candidates {best[1]}" if best else "none of the grid"),
          flush=True)


def choose_budgets(sizes: list[int]) -> None:
    """The single keys, crowded width and candidates at long n, by the module docstring's
    rule."""
    for n in sizes:
        rows = measure(n, {setting: selector(n_keys=setting[0], wide_keys=setting[1],
                                             candidates=setting[2]) for setting in BUDGETS})
        print_table(f"n = {n}, sub-blocks of 8:", "n_keys / wide / candidates", rows)
        met = sorted((s for s in rows if mean(rows[s], 0) >= BAR), key=lambda s: (s[0], s[2]))
        best = max(rows, key=lambda s: mean(rows[s], 0))
        print(f"chosen at n={n} (fewest keys, then candidates, with mean recall >= {BAR}): "
              + (" / ".join(map(str, met[0])) if met else
                 f"none; the highest is {' / '.join(map(str, best))} "
                 f"({mean(rows[best], 0):.4f})"), flush=True)


def choose_precision(sizes: list[int], split: str = "train") -> None:
    """Which half formats the selector may read, by the module docstring's rule."""
    chosen = selector(candidates=3072, wide_keys=1024)

    def reading(dtype: torch.dtype):  # noqa: ANN202
        def make():  # noqa: ANN202
            select = chosen()
            return lambda q, k: select(q.to(dtype), k.to(dtype))
        return make

    formats = {"float32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    losses: dict[str, list[float]] = {}
    for n in sizes:
        rows = measure(n, {name: reading(dtype) for name, dtype in formats.items()},
                       split=split)
        print_table(f"n = {n}, sub-blocks of 8, 3072 candidates, crowded blocks keep 1024:",
                    "q/k", rows, seconds=False)
        for name, cells in rows.items():
            losses.setdefault(name, []).append(mean(rows["float32"], 0) - mean(cells, 0))
    used = [name for name in ("fp16", "bf16") if max(losses[name]) <= HALF_LOSS]
    print("largest recall loss against float32: " + ", ".join(
        f"{name} {max(losses[name]):+.4f}" for name in ("fp16", "bf16")))
    if split != "train":
        print("(validation: a report, nothing is chosen here)")
        return
    print(f"chosen (loss <= {HALF_LOSS} at every n): {', '.join(used) or 'neither'}",
          flush=True)


if __name__ == "__main__":
    main()
