"""Times projection training for all heads from 1,000 passages of the default corpus.

Gold graphs of the default model are extracted first (not timed: that is the teacher's
forward pass, minutes on CPU); then ``train_projections`` (paper Eq. 7, one epoch, defaults)
is timed for all 6 × 12 heads. The default corpus' train split has fewer than 1,000 passages,
so its texts are cycled to 1,000 (said on stdout); repeated texts are extracted once, since
their gold graphs are identical. Last line: ``seconds=<s> pairs_per_s=<p>``, where pairs are
the gold (query, key) edges of all heads and layers — one epoch sees each at least once.
``--smoke``: 2 passages.
"""

from __future__ import annotations

import itertools
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

from sparsefinder.data.chunking import chunk_passages  # noqa: E402
from sparsefinder.data.corpus import load_corpus  # noqa: E402
from sparsefinder.data.records import extract  # noqa: E402
from sparsefinder.models.loading import load_model  # noqa: E402
from sparsefinder.projections.hinge import train_projections  # noqa: E402


def main() -> None:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--passages", type=int, default=1000)
    made.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parse(made, smoke={"passages": 2})
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model("default", device="cpu")
    texts = chunk_passages(load_corpus("default", "train"), loaded.tokenizer, loaded.max_length)
    if len(texts) < args.passages:
        print(f"the train split has {len(texts)} passages (after chunking to "
              f"{loaded.max_length} tokens) < {args.passages}: cycling it")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unique = extract(loaded, texts[: args.passages], progress=True)
    records = list(itertools.islice(itertools.cycle(unique), args.passages))
    print(f"extracted {len(unique)} unique texts in {time.perf_counter() - t0:.1f} s (not timed)")
    start = time.perf_counter()
    projections = train_projections(records, model_id=loaded.model_id, alpha=loaded.alpha)
    seconds = time.perf_counter() - start
    pairs = sum(projections.metadata["positives_per_layer"])
    print(f"{len(records)} passages, {projections.num_layers} layers x "
          f"{projections.num_heads} heads, {pairs} positive pairs, "
          f"torch threads={torch.get_num_threads()}")
    print(f"seconds={seconds:.1f} pairs_per_s={pairs / seconds:.0f}")


if __name__ == "__main__":
    main()
