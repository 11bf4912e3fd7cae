"""Times ``sparsefinder prepare`` end to end on random BERT-shaped models, stage by stage.

Two shapes, random weights (initializer range 0.5, so entmax is sparse) and the default
model's WordPiece tokenizer, saved as local folders (nothing downloaded):

* ``tiny`` — 2 layers × 4 heads, hidden 32, 128 positions, 24 passages of each split of
  the default corpus (what ``tests/commands/test_prepare.py`` prepares); budget 60 s;
* ``base`` — BERT-base's shape: 12 layers × 12 heads, hidden 768, 512 positions, the whole
  default corpus; budget 15 min.

Each run is ``python -m sparsefinder prepare --model DIR --device D --out TMP`` in a fresh
process, as a user runs it: the wall time includes Python's start and the model's load; the
stage times come from the bundle's ``bundle.json``; the peak memory is the child's max RSS.
The refinement's optimizer steps per layer (at most ``MAX_STEPS`` an epoch) and its dense heads
are printed too: they do not depend on the load.
The machine's load average is printed with each run (a shared machine's timings are only
indicative). The last line: ``<shape>_s=<wall seconds> <shape>_within=<1|0> ...``.

Run: ``flock /tmp/sparsefinder-bench.lock .venv/bin/python benchmarks/prepare.py``
(``--shapes tiny``, ``--device cuda``; ``--smoke``: the tiny shape on 12 passages).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import cuda_missing, parse, parser, skip  # noqa: E402

SHAPES = {
    "tiny": {"config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "intermediate_size": 64, "max_position_embeddings": 128},
             "passages": 24, "budget_s": 60},
    "base": {"config": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                        "intermediate_size": 3072, "max_position_embeddings": 512},
             "passages": None, "budget_s": 900},
}


def save_random_bert(folder: Path, config: dict) -> Path:
    """A random BERT of ``config``'s shape with the default model's tokenizer, in ``folder``."""
    import torch
    from transformers import AutoModel, AutoTokenizer, BertConfig

    from sparsefinder.models.loading import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    torch.manual_seed(0)
    model = AutoModel.from_config(BertConfig(vocab_size=tokenizer.vocab_size,
                                             initializer_range=0.5, **config))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def prepare_once(model: Path, out: Path, device: str, passages: int | None) -> dict:
    """One ``sparsefinder prepare`` in a child process: wall seconds, stage seconds, max RSS."""
    command = [sys.executable, "-m", "sparsefinder", "prepare", "--model", str(model),
               "--device", device, "--out", str(out)]
    if passages is not None:
        command += ["--max-passages", str(passages)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"prepare failed ({done.returncode}):\n{done.stderr[-3000:]}")
    manifest_path = next(out.glob("*/bundle.json"))
    manifest = json.loads(manifest_path.read_text())
    rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    from sparsefinder.prepare import PROJECTIONS
    from sparsefinder.projections.heads import HeadProjections

    meta = HeadProjections.load(manifest_path.parent / PROJECTIONS).metadata
    return {"wall": wall, "stages": manifest["prepared"]["seconds"], "rss_mib": rss_mib,
            "steps": meta.get("steps", []),
            "dense": sum(len(heads) for heads in meta.get("dense_heads", []))}


def main() -> None:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--shapes", default="tiny,base", help="comma-separated: tiny, base")
    made.add_argument("--device", default="cpu")
    made.add_argument("--passages", type=int, default=None,
                      help="passages of each split (default: the shape's)")
    args = parse(made, smoke={"shapes": "tiny", "passages": 12})
    missing = cuda_missing(args.device)
    if missing:
        skip(missing)
        return
    fields = {}
    for shape in args.shapes.split(","):
        spec = SHAPES[shape]
        passages = args.passages if args.passages is not None else spec["passages"]
        with tempfile.TemporaryDirectory(prefix=f"prepare-{shape}-") as tmp:
            model = save_random_bert(Path(tmp) / "model", spec["config"])
            load = os.getloadavg()[0]
            result = prepare_once(model, Path(tmp) / "bundles", args.device, passages)
        stages = " ".join(f"{k}={v:.1f}s" for k, v in result["stages"].items())
        print(f"{shape}: {result['wall']:.1f} s wall ({sum(result['stages'].values()):.1f} s of "
              f"stages: {stages}), peak {result['rss_mib']:.0f} MiB, passages "
              f"{passages or 'all'}, device {args.device}, load {load:.2f} -> "
              f"{os.getloadavg()[0]:.2f}; budget {spec['budget_s']} s", flush=True)
        print(f"{shape}: refinement steps per layer {result['steps']}, dense heads "
              f"{result['dense']} (not refined)", flush=True)
        fields[f"{shape}_s"] = f"{result['wall']:.1f}"
        fields[f"{shape}_within"] = int(result["wall"] <= spec["budget_s"])
        fields[f"{shape}_refine_steps"] = sum(result["steps"])
        for stage, seconds in result["stages"].items():
            fields[f"{shape}_{stage}_s"] = f"{seconds:.1f}"
    print(" ".join(f"{key}={value}" for key, value in fields.items()))


if __name__ == "__main__":
    main()
