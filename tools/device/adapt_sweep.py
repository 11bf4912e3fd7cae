"""Compare entmax-adapter settings on held-out TRAIN passages (never validation), one
process per setting, on a lent GPU (tools/device/run4.sh) or here.

    python tools/device/adapt_sweep.py --data .gpu/adapt/data.json --only NAME --out DIR

``data.json`` (``--write-data``, made on the machine whose Python gives the default corpus'
split) holds the train passages by source and the held-out passages: every 10th of
default + austen + news in that order, as ``sparsefinder adapt --holdout-every 10`` takes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SETTINGS: dict[str, dict] = {
    "c0_t128": dict(sources=("default", "austen"), cfg=dict(max_tokens=128, batch_size=8)),
    "c1_t256": dict(sources=("default", "austen"), cfg=dict(max_tokens=256, batch_size=4)),
    "c2_t512": dict(sources=("default", "austen"), cfg=dict(max_tokens=512, batch_size=2)),
    "c3_t512b4": dict(sources=("default", "austen"), cfg=dict(max_tokens=512, batch_size=4)),
    "c4_t256_news": dict(sources=("default", "austen", "news"),
                         cfg=dict(max_tokens=256, batch_size=4)),
    "c5_t256_pool3": dict(sources=("default", "austen"),
                          cfg=dict(max_tokens=256, batch_size=4, w_pooled=3.0)),
    "c6_t256_r32": dict(sources=("default", "austen"),
                        cfg=dict(max_tokens=256, batch_size=4, rank=32, lora_alpha=32.0)),
    "c7_t256_ws025": dict(sources=("default", "austen"),
                          cfg=dict(max_tokens=256, batch_size=4, w_sparse=0.25)),
    "c8_t256_1500": dict(sources=("default", "austen"),
                         cfg=dict(max_tokens=256, batch_size=4, steps=1500)),
    "c9_t512_news_pool3": dict(sources=("default", "austen", "news"),
                               cfg=dict(max_tokens=512, batch_size=2, w_pooled=3.0)),
}
BASE = dict(alpha=1.5, rank=16, lora_alpha=16.0, steps=1000, lr=2e-3, w_sparse=0.5)


def write_data(path: Path) -> None:
    from sparsefinder.data.corpus import default_corpus, load_corpus

    sources = {"default": default_corpus("train"),
               "austen": load_corpus("build/austen.txt", "train"),
               "news": load_corpus("build/news.txt", "train")}
    order = [(s, i) for s in sources for i in range(len(sources[s]))]
    held = {pos for pos in range(0, len(order), 10)}
    data = {"train": {s: [] for s in sources}, "held_out": {s: [] for s in sources}}
    for pos, (s, i) in enumerate(order):
        data["held_out" if pos in held else "train"][s].append(sources[s][i])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    print({k: {s: len(v) for s, v in d.items()} for k, d in data.items()})


def run(name: str, data: dict, out: Path, device: str, steps: int | None = None) -> None:
    from sparsefinder.adaptation.distill import adapt_model, measure, softmax_teacher
    from sparsefinder.adaptation.objective import AdaptConfig
    from sparsefinder.models.loading import load_model

    setting = SETTINGS[name]
    smoke = {"steps": steps, "warmup": 1} if steps else {}
    config = AdaptConfig(**{**BASE, **setting["cfg"], **smoke})
    train = [p for s in setting["sources"] for p in data["train"][s]]
    held = [p for s in ("default", "austen") for p in data["held_out"][s]]
    base = load_model("default-softmax", alpha=1.5, device=device)
    began = time.perf_counter()
    result = adapt_model(base, train, held[:8], config, out / name, base_name="default-softmax",
                         data_label="+".join(setting["sources"]), choose_texts=held,
                         measure_every=250, on_step=lambda step, parts: "held_out_cos" in parts
                         and print(name, step, parts, flush=True))
    teacher = softmax_teacher(load_model("default-softmax", alpha=1.5, device=device).model)
    news = measure(base.model, teacher, base.tokenizer,
                   data["held_out"]["news"], base.device, base.max_length).summary()
    line = {"name": name, "config": config.as_dict(), "train_passages": len(train),
            "chunks": result.metadata["training_chunks"],
            "train_seconds": round(result.state.seconds, 1),
            "wall": round(time.perf_counter() - began, 1),
            "held_out": result.metadata["held_out_train"], "held_out_news": news,
            "curve": [(c["step"], c["mean_cosine"], c["min_cosine"], c["gold_sparsity"])
                      for c in result.metadata["curve"]]}
    print(json.dumps(line), flush=True)
    (out / f"{name}.json").write_text(json.dumps(line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--write-data", action="store_true")
    parser.add_argument("--only", choices=sorted(SETTINGS))
    parser.add_argument("--names", action="store_true", help="print the settings' names")
    parser.add_argument("--out", type=Path, default=Path("runs/adapt-sweep"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, help="override every setting's steps (smoke runs)")
    args = parser.parse_args(argv)
    if args.names:
        print(" ".join(SETTINGS))
        return 0
    if args.write_data:
        write_data(args.data)
        return 0
    data = json.loads(args.data.read_text())
    for name in [args.only] if args.only else SETTINGS:
        run(name, data, args.out, args.device, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
