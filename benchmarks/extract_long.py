"""Bounded-memory gold extraction of one 12-head layer at n = 8192: peak extra memory, time.

Run under the shared lock:
``flock /tmp/sparsefinder-bench.lock .venv/bin/python benchmarks/extract_long.py``.

Inputs: the same real q/k as ``benchmarks/restricted.py`` (all-MiniLM-L6-v2 layer 2 over
consecutive 512-token windows of the default corpus, concatenated). The extraction
(:func:`sparsefinder.attention.gold_edges.entmax_edges`, default budget) runs in a fresh process
that
resets its peak RSS just before the call (``/proc/self/clear_refs`` ← 5) and reports
``VmHWM - VmRSS at reset``: every byte torch or anything else needed, the edges included.
Exactness: at n = 1024 the edges equal those of the dense path (one (heads, n, n) solve).

Last line: ``n=<n> extra_mib=<peak> edges=<count> seconds=<s> exact_1024=<0|1>`` (below
n = 1024 the exactness check runs at n). ``--smoke``: n = 512.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import parse, parser  # noqa: E402

CHILD = """
import json, sys, time, torch
from sparsefinder.attention.gold_edges import entmax_edges
def rss(field):
    for line in open('/proc/self/status'):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
data = torch.load(sys.argv[1], weights_only=True)
q, k = data['q'], data['k']
entmax_edges(q[:, :256], k[:, :256], 32 ** -0.5)  # warm-up: lazy init
open('/proc/self/clear_refs', 'w').write('5')
base = rss('VmRSS')
start = time.perf_counter()
edges, _ = entmax_edges(q, k, 32 ** -0.5)
seconds = time.perf_counter() - start
print(json.dumps({'extra_mib': rss('VmHWM') - base, 'seconds': seconds, 'edges': edges.nnz,
                  'edge_mib': edges.nbytes / 2**20, 'density': edges.density}))
"""


def main() -> None:
    from restricted import real_qk

    from sparsefinder.attention.entmax_ops import entmax_normalize
    from sparsefinder.attention.gold_edges import GoldEdges, entmax_edges

    made = parser(__doc__.splitlines()[0])
    made.add_argument("n", type=int, nargs="?", default=8192, help="tokens (default 8192)")
    n = parse(made, smoke={"n": 512}).n
    exact_n = min(1024, n)
    print(f"load avg {os.getloadavg()[0]:.2f} (over {os.cpu_count()} cores), "
          f"torch threads {torch.get_num_threads()}")
    q, k, source = real_qk(2, n)
    with torch.inference_mode():
        small_q, small_k = q[:, :exact_n], k[:, :exact_n]
        dense = GoldEdges.from_probs(entmax_normalize(
            (small_q @ small_k.transpose(-1, -2)) * 32 ** -0.5, 1.5))
        blocked, _ = entmax_edges(small_q, small_k, 32 ** -0.5, budget_mib=16)
    exact = int(torch.equal(dense.indptr, blocked.indptr)
                and torch.equal(dense.indices, blocked.indices))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qk.pt"
        torch.save({"q": q, "k": k}, path)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                              text=True, env=env, check=True)
        wall = time.perf_counter() - start
    result = json.loads(done.stdout.strip().splitlines()[-1])
    dense_gib = 12 * n * n * 4 / 2**30
    print(f"inputs: MiniLM layer 2 q/k, {source}, n={n}, 12 heads; one dense float32 copy of "
          f"the scores would be {dense_gib:.1f} GiB")
    print(f"bounded extraction: {result['seconds']:.1f} s (process wall {wall:.1f} s), peak "
          f"extra RSS {result['extra_mib']:.0f} MiB of which edges {result['edge_mib']:.0f} MiB "
          f"({result['edges']} edges, density {result['density']:.4f})")
    print(f"n={exact_n}: blocked edges equal the dense path's: {bool(exact)} "
          f"({dense.nnz} edges, max |Δp| {float((dense.values - blocked.values).abs().max()):.1e})")
    print(f"load avg after {os.getloadavg()[0]:.2f}")
    print(f"n={n} extra_mib={result['extra_mib']:.0f} edges={result['edges']} "
          f"seconds={result['seconds']:.1f} exact_1024={exact}")


if __name__ == "__main__":
    main()
