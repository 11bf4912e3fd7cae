"""The notebook explorer's first render, warm: ``explore(model, text)`` with live widgets.

"Warm" is a process that has explored once already (imports done, compiled kernels loaded):
what a notebook user waits for on their next text. Measured with the model already loaded
(``explore(loaded, text)``: the gold graphs, the projections, the first prediction, the two
figures and the widgets) and by name (``explore("default", text)``: the model loaded again
from disk too), then one control move (the layer slider).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/notebook_render.py [--repeats 5]

Last line: ``warm_loaded_p50_s=<x> warm_by_name_s=<y> move_p50_s=<z>``. ``--smoke``: one
repeat.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

TEXT = ("The committee postponed the vote because it needed more time. "
        "Its members will meet again next week.")


def main() -> None:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--repeats", type=int, default=5)
    args = parse(made, {"repeats": 1})
    from sparsefinder.models.loading import load_model
    from sparsefinder.notebook import explore

    started = time.perf_counter()
    explore("default", TEXT, widgets=True)
    print(f"cold first render (this process's first): {time.perf_counter() - started:.2f} s")
    loaded = load_model("default", alpha=1.5, device="cpu")
    renders, moves = [], []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        view = explore(loaded, TEXT, widgets=True)
        renders.append(time.perf_counter() - started)
        started = time.perf_counter()
        view.controls["layer"].value = 1 + repeat % (view.prepared.num_layers - 1)
        moves.append(time.perf_counter() - started)
    started = time.perf_counter()
    explore("default", TEXT, widgets=True)
    by_name = time.perf_counter() - started
    print(f"warm first render, model loaded: best {min(renders):.2f} s, "
          f"median {statistics.median(renders):.2f} s over {len(renders)}")
    print(f"warm_loaded_p50_s={statistics.median(renders):.3f} warm_by_name_s={by_name:.3f} "
          f"move_p50_s={statistics.median(moves):.3f}")


if __name__ == "__main__":
    main()
