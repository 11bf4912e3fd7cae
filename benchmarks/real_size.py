"""Sparsefinder on models of real size: BERT-base at 512 tokens, a ~1 B Llama-shaped decoder
with grouped-query attention at 2048 tokens. Random weights of the real shape (no download).

For one shape, each step in a fresh process (so peak memory is its own):

* ``extract``: gold-graph extraction (α = 1.5 entmax, every layer) of one text of ``--tokens``
  tokens against the stock model's SDPA softmax forward on the same input (median of
  ``--rounds``); peak resident memory of the whole process (weights included) and the peak
  above the loaded model, read from ``/proc/self/status`` (``VmHWM`` after a reset);
* ``train``: projection training (paper Eq. 7, r = 4, one epoch) on ``--passages`` texts;
* ``move``: a slider move as the app makes it: the text prepared once (``open_s``: its scorer
  built), then per move every head of every layer predicted with the trained projections
  (distance, t = 1) and scored with every metric, layer by layer, and the viewed head's mask
  read (``move_ms``, the median of ``--rounds`` after one untimed move);
* ``app`` (``--app``): the app's slider p50/p95 in a real browser,
  ``benchmarks/app_latency.py --model FOLDER --tokens N --method fixed``.

Weights: the stock initialisation (std 0.02), then the query and key maps scaled by
``--qk-scale`` so the random scores spread as a trained model's do and entmax
is sparse. Scaling every weight instead collapses the tokens of a deep random network onto
one another (dense attention in the upper layers). The gold sparsity is printed.

    flock /tmp/sparsefinder-bench.lock .venv/bin/python benchmarks/real_size.py --shape bert-base
    flock /tmp/sparsefinder-bench.lock .venv/bin/python benchmarks/real_size.py --shape llama-1b

``--device cuda`` runs the model on a GPU and keeps the prepared text there (gold bits,
vectors, predictions, scorer: only the scores and the viewed head come to the host); the
``llama-8b`` shape (Llama-3-8B-shaped, random weights, GQA) runs only there:

    .venv/bin/python benchmarks/real_size.py --shape llama-1b --tokens 4096 --device cuda
    .venv/bin/python benchmarks/real_size.py --shape llama-8b --device cuda

Last line: ``shape=… n=… extract_s=… sdpa_s=… ratio=… peak_mib=… extra_mib=… train_s=…
open_s=… move_ms=… gold_sparsity=…`` (and ``app_p50_ms=… app_p95_ms=…`` with ``--app``).

``--smoke``: ``--shape tiny`` (a 2-layer BERT of hidden size 64), 64 tokens, one round, two
passages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import parse, parser  # noqa: E402

#: shape -> (tokens, query/key weight scale, description)
SHAPES = {
    "bert-base": (512, 1.8, "BERT-base: 12 layers x 12 heads, d=768, head dim 64, 110 M"),
    "llama-1b": (2048, 1.2, "Llama-shaped: 16 layers x 32 query heads (8 key/value), d=2048, "
                            "head dim 64, FFN 8192, ~1.0 B"),
    "tiny": (64, 1.8, "tiny BERT (smoke runs): 2 layers x 4 heads, d=64, head dim 16"),
    # a GPU-only shape (--device cuda): 32 GB of float32 weights
    "llama-8b": (4096, 1.2, "Llama-3-8B-shaped: 32 layers x 32 query heads (8 key/value), "
                            "d=4096, head dim 128, FFN 14336, ~8 B"),
}


def build(shape: str, folder: Path, qk_scale: float, max_positions: int = 8192) -> Path:
    """A random model of ``shape`` saved to ``folder`` with a tokenizer (safetensors); a
    decoder shape takes ``max_positions`` tokens (RoPE: no weights depend on it)."""
    import torch
    from transformers import AutoModel, BertConfig, LlamaConfig

    if shape == "bert-base":
        from sparsefinder.models.loading import load_model

        tokenizer = load_model("default-softmax", device="cpu").tokenizer  # WordPiece, 30522
        config = BertConfig()  # the stock BERT-base shape
    elif shape == "tiny":
        from transformers import AutoTokenizer

        from sparsefinder.models.loading import default_model_path

        tokenizer = AutoTokenizer.from_pretrained(default_model_path())  # the default's files
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64,
                            num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            max_position_embeddings=128)
    else:
        from sparsefinder.models.decoders import tiny_bpe_tokenizer

        tokenizer = tiny_bpe_tokenizer(max_positions)
        big = shape == "llama-8b"
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=4096 if big else 2048,
                             intermediate_size=14336 if big else 8192,
                             num_hidden_layers=32 if big else 16, num_attention_heads=32,
                             num_key_value_heads=8, head_dim=128 if big else 64,
                             max_position_embeddings=max_positions, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.split(".")[-2] in ("query", "key", "q_proj", "k_proj"):
                param.mul_(qk_scale)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    print(f"built {shape}: {params / 1e6:.0f} M parameters in {folder}", flush=True)
    return folder


def text_of(tokenizer, tokens: int, offset: int = 0) -> str:
    """Consecutive train passages of the default corpus, cut to ``tokens`` tokens."""
    from sparsefinder.data.corpus import default_corpus

    passages = default_corpus("train")[offset:]
    ids: list[int] = []
    for passage in passages:
        ids += tokenizer(passage, add_special_tokens=False)["input_ids"]
        if len(ids) >= tokens:
            break
    special = len(tokenizer("")["input_ids"])  # [CLS] [SEP] of an encoder, none for BPE
    return tokenizer.decode(ids[: tokens - special])


def _rss(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_extract(folder: str, tokens: int, rounds: int, device: str = "cpu") -> dict:
    """Extraction vs SDPA softmax, and the peak memory of an extraction."""
    import torch
    from transformers import AutoModel

    from sparsefinder.data.records import extract
    from sparsefinder.models.loading import load_model

    loaded = load_model(folder, alpha=1.5, device=device)
    text = text_of(loaded.tokenizer, tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        extract(loaded, text[: len(text) // 8])  # warm-up: lazy init, compiled solver
    Path("/proc/self/clear_refs").write_text("5")
    base = _rss("VmRSS")
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        (record,) = extract(loaded, text)
        times.append(time.perf_counter() - start)
    peak, extra = _rss("VmHWM"), _rss("VmHWM") - base
    n = record.n_tokens
    sparse = [layer for layer in record.layers if not layer.is_softmax]
    allowed = sum(float(math.prod(layer.gold_shape)) for layer in sparse) or 1.0
    if record.causal:
        allowed = allowed * (n + 1) / (2 * n)
    sparsity = 1 - sum(float(layer.gold.sum()) for layer in sparse) / allowed
    del loaded, record
    stock = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval().to(device)
    from transformers import AutoTokenizer

    inputs = AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt").to(device)
    with torch.inference_mode():
        stock(**inputs)
        sdpa = []
        for _ in range(rounds):
            start = time.perf_counter()
            stock(**inputs)
            sdpa.append(time.perf_counter() - start)
    return {"n": n, "extract_s": statistics.median(times), "sdpa_s": statistics.median(sdpa),
            "peak_mib": peak, "extra_mib": extra, "gold_sparsity": sparsity}


def child_train(folder: str, tokens: int, passages: int, out: str, device: str = "cpu") -> dict:
    """Projection training time on ``passages`` texts (extraction not timed)."""
    from sparsefinder.data.records import extract
    from sparsefinder.models.loading import load_model
    from sparsefinder.projections.hinge import train_projections

    loaded = load_model(folder, alpha=1.5, device=device)
    texts = [text_of(loaded.tokenizer, tokens, offset=7 * i) for i in range(passages)]
    records = extract(loaded, texts, batch_size=1)
    start = time.perf_counter()
    projections = train_projections(records, model_id=loaded.model_id, alpha=loaded.alpha,
                                    dense_heads="zero")
    seconds = time.perf_counter() - start
    projections.save(out)
    return {"train_s": seconds}


def child_move(folder: str, tokens: int, projections_file: str, rounds: int,
               device: str = "cpu") -> dict:
    """A slider move as the app makes it: the text prepared once (its scorer built, on
    ``device``), then per move every head of every layer predicted (distance, t = 1) and
    scored with every metric, layer by layer (``live.predict``'s lazy masks), and the viewed
    head's mask read; timed moves, after one untimed (compilation, caches)."""
    import torch

    from sparsefinder.data.records import extract
    from sparsefinder.explore import live
    from sparsefinder.explore import prepared as prep
    from sparsefinder.methods.spec import PredictorSpec
    from sparsefinder.models.loading import load_model
    from sparsefinder.projections.heads import HeadProjections

    loaded = load_model(folder, alpha=1.5, device=device)
    (record,) = extract(loaded, text_of(loaded.tokenizer, tokens, offset=3))
    projections = HeadProjections.load(projections_file)
    start = time.perf_counter()
    prepared = prep.prepare(record, projections, t_range=False, device=loaded.device)
    open_s = time.perf_counter() - start
    spec = PredictorSpec.of("distance", {"threshold": 1.0})
    layer, head = record.num_layers // 2, 0
    times, parts = [], []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        masks = live.predict(prepared, spec)
        live.score(prepared, masks)  # every layer predicted and scored in turn
        masks[layer][head].cpu()  # the viewed head, drawn on the host
        if loaded.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        parts.append(len(masks.held))
    return {"open_s": open_s, "move_ms": 1000 * statistics.median(times[1:]),
            "move_max_ms": 1000 * max(times[1:]), "layers_held": parts[-1]}


def _run_child(step: str, *args: object) -> dict:
    command = [sys.executable, __file__, "--child", step, *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"step {step} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--shape", choices=sorted(SHAPES), default="bert-base")
    made.add_argument("--tokens", type=int, default=None)
    made.add_argument("--qk-scale", type=float, default=None)
    made.add_argument("--rounds", type=int, default=3)
    made.add_argument("--passages", type=int, default=8)
    made.add_argument("--app", action="store_true", help="also the browser slider latency")
    made.add_argument("--keep", type=Path, default=None, help="build the model here, keep it")
    made.add_argument("--device", default="cpu", help="cpu or cuda: where the model runs "
                      "and the prepared text lives (gold bits, vectors, predictions, scorer)")
    made.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parse(made, smoke={"shape": "tiny", "rounds": 1, "passages": 2})
    if args.child:
        step, rest = args.child[0], args.child[1:]
        funcs = {"extract": lambda f, t, r, d: child_extract(f, int(t), int(r), d),
                 "train": lambda f, t, p, o, d: child_train(f, int(t), int(p), o, d),
                 "move": lambda f, t, p, r, d: child_move(f, int(t), p, int(r), d)}
        print(json.dumps(funcs[step](*rest)))
        return
    if args.device == "cpu" and args.shape == "llama-8b":
        raise SystemExit("llama-8b is a GPU shape (32 GB of weights): pass --device cuda")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"skipped: --device {args.device} needs a CUDA GPU (none visible here)")
            print(f"shape={args.shape} skipped=1")
            return
    tokens, qk_scale, about = SHAPES[args.shape]
    tokens, qk_scale = args.tokens or tokens, args.qk_scale or qk_scale
    print(f"{about}; {tokens} tokens; load average {os.getloadavg()[0]:.2f} over "
          f"{os.cpu_count()} cores", flush=True)
    scratch = tempfile.TemporaryDirectory()
    folder = args.keep or Path(scratch.name) / args.shape
    if not (folder / "config.json").exists():
        build(args.shape, folder, qk_scale)
    result: dict = {"shape": args.shape}
    result.update(_run_child("extract", folder, tokens, args.rounds, args.device))
    result["ratio"] = result["extract_s"] / result["sdpa_s"]
    print(f"extract {result['extract_s']:.2f} s vs SDPA softmax {result['sdpa_s']:.2f} s "
          f"(ratio {result['ratio']:.2f}); peak {result['peak_mib']:.0f} MiB, "
          f"{result['extra_mib']:.0f} MiB above the loaded model; gold sparsity "
          f"{result['gold_sparsity']:.3f}", flush=True)
    projections = Path(scratch.name) / "projections.pt"
    result.update(_run_child("train", folder, tokens, args.passages, projections, args.device))
    print(f"projection training on {args.passages} texts: {result['train_s']:.1f} s", flush=True)
    result.update(_run_child("move", folder, tokens, projections, args.rounds, args.device))
    print(f"open {result['open_s']:.1f} s (scorer built once); one slider move (predict + "
          f"every metric, all heads, layer by layer): {result['move_ms']:.0f} ms (max "
          f"{result['move_max_ms']:.0f})", flush=True)
    if args.app:
        command = [sys.executable, str(ROOT / "benchmarks" / "app_latency.py"), "--model",
                   str(folder), "--tokens", str(tokens), "--method", "window", "--moves", "20"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        fields = dict(part.split("=") for part in last.split() if "=" in part)
        if done.returncode or "p50_ms" not in fields:
            print(f"app latency failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        else:
            result["app_p50_ms"], result["app_p95_ms"] = fields["p50_ms"], fields["p95_ms"]
    scratch.cleanup()
    print(" ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                   for key, value in result.items()))


if __name__ == "__main__":
    main()
