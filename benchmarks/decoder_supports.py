"""Gold supports of a ~1 B decoder at 16 384 tokens on one device: every layer, bit-packed.

The model: ``real_size.py``'s ``llama-1b`` shape (16 layers × 32 query heads, 8 key/value
heads, head dim 64), random weights with the query/key maps scaled so entmax is sparse (no
download). One text of ``--tokens`` tokens from the default corpus's train passages.

* ``extract_s``: :func:`sparsefinder.data.long_context.extract_supports` on it — α = 1.5 entmax
  in every layer, block by block (``--budget-mib`` of scores a block), each layer's support
  kept on the device as bits (``heads · n · ⌈n/8⌉`` bytes: 1 GiB a layer at 16 384);
  ``sdpa_s``: the stock model's SDPA softmax forward on the same input (median of
  ``--rounds`` after a warm-up each);
* ``peak_gib``: the device's allocator peak during the extraction above the loaded weights
  (bits included; NaN on a CPU), ``bits_gib`` the bits alone, ``gold_sparsity`` over every
  layer's causal pairs;
* ``check_*``: the supports at ``--check-tokens`` tokens computed on the device against the CPU
  path (:func:`sparsefinder.data.records.extract`, dense, on a CPU copy of the same weights):
  ``check_mismatch`` pairs out of ``check_pairs`` differ (two devices' roundings may move a
  key that lies on a row's threshold; 0 on a CPU, where both run on the same kernels).

``--save-qk FILE`` also writes layer ``--qk-layer``'s q/k at ``--qk-tokens`` tokens (float16,
key heads repeated to the query heads) for ``gpu_attention.py --inputs decoder --decoder-qk
FILE``; the forward stops after that layer.

    .venv/bin/python benchmarks/decoder_supports.py --device cuda [--tokens 16384]
        [--save-qk /tmp/decoder_qk.pt --qk-tokens 32768]

Last line: ``shape=… n=… extract_s=… sdpa_s=… ratio=… peak_gib=… bits_gib=… gold_sparsity=…
check_n=… check_mismatch=… check_pairs=…``. ``--smoke``: a 2-layer random Llama on the CPU,
256 tokens (check at 64).
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cuda_missing, parse, parser, skip  # noqa: E402


class _Stop(Exception):  # noqa: N818  (control flow, not an error)
    """Raised by the q/k sink once it has its layer: the rest of the forward is not needed."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model_folder(args, root: Path) -> Path:  # noqa: ANN001
    """The random model, saved (``real_size.build``, or a tiny Llama under ``--smoke``)."""
    positions = max(args.tokens, args.qk_tokens if args.save_qk else 0, args.check_tokens)
    if args.smoke:
        from sparsefinder.models.decoders import save_tiny_decoder

        return save_tiny_decoder("llama", root / "tiny", max_positions=max(positions, 512))
    from real_size import SHAPES, build

    return build(args.shape, root / args.shape, SHAPES[args.shape][1], max_positions=positions)


def _supports(loaded, text: str, args, device: torch.device):  # noqa: ANN001, ANN202
    from sparsefinder.data.long_context import extract_supports

    times = []
    for _ in range(args.rounds):
        record = None  # the last round's bits freed before the next
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        start = time.perf_counter()
        record = extract_supports(loaded, text, budget_mib=args.budget_mib,
                                  max_edge_mib=args.max_bits_mib)
        _sync(device)
        times.append(time.perf_counter() - start)
    peak = ((torch.cuda.max_memory_allocated(device) - base) / 2**30
            if device.type == "cuda" else math.nan)
    return record, statistics.median(times), peak


def _sdpa_seconds(folder: Path, text: str, args, device: torch.device) -> float:  # noqa: ANN001
    from transformers import AutoModel, AutoTokenizer

    stock = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval().to(device)
    inputs = AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt").to(device)
    times = []
    with torch.inference_mode():
        stock(**inputs)
        for _ in range(args.rounds):
            _sync(device)
            start = time.perf_counter()
            stock(**inputs)
            _sync(device)
            times.append(time.perf_counter() - start)
    del stock
    return statistics.median(times)


def _check(folder: Path, loaded, text_of, args) -> tuple[int, int, int]:  # noqa: ANN001
    """(n, pairs that differ, pairs) between the device's supports and the CPU's dense path."""
    from sparsefinder.data.long_context import extract_supports
    from sparsefinder.data.records import extract
    from sparsefinder.models.loading import load_model

    text = text_of(loaded.tokenizer, args.check_tokens)
    ours = extract_supports(loaded, text, budget_mib=args.budget_mib)
    cpu = load_model(str(folder), alpha=1.5, device="cpu")
    (dense,) = extract(cpu, text)
    differ = pairs = 0
    for bits, layer in zip(ours.layers, dense.layers, strict=True):
        gold = layer.gold
        differ += int((bits.to("cpu").to_dense() != gold).sum())
        pairs += gold.numel()
    return dense.n_tokens, differ, pairs


def _save_qk(loaded, text_of, args) -> None:  # noqa: ANN001
    """Layer ``--qk-layer``'s q/k (heads, n, d) at ``--qk-tokens`` tokens to ``--save-qk``."""
    from sparsefinder.attention.interface import capture_edges

    text = text_of(loaded.tokenizer, args.qk_tokens)
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"]], device=loaded.device)
    kept = {}

    def sink(call) -> None:  # noqa: ANN001
        if call.layer == args.qk_layer:
            kept["q"], kept["k"] = (t[0].to(torch.float16).cpu() for t in (call.query, call.key))
            raise _Stop

    try:
        with torch.inference_mode(), capture_edges(sink, budget_mib=args.budget_mib,
                                                   max_edge_mib=args.max_bits_mib, form="bits"):
            loaded.model(input_ids=ids)
    except _Stop:
        pass
    if not kept:
        raise SystemExit(f"--qk-layer {args.qk_layer}: the model has fewer layers")
    torch.save(kept, args.save_qk)
    print(f"saved q/k {tuple(kept['q'].shape)} of layer {args.qk_layer} to {args.save_qk}",
          flush=True)


def main() -> int:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--device", default="cuda")
    made.add_argument("--shape", default="llama-1b", choices=["llama-1b", "llama-8b"])
    made.add_argument("--tokens", type=int, default=16384)
    made.add_argument("--rounds", type=int, default=1)
    made.add_argument("--budget-mib", type=float, default=4096,
                      help="scores of one extraction block (256 suits a CPU)")
    made.add_argument("--max-bits-mib", type=float, default=8192,
                      help="cap on one layer's bits")
    made.add_argument("--check-tokens", type=int, default=512)
    made.add_argument("--save-qk", help="also write one layer's q/k here (gpu_attention.py)")
    made.add_argument("--qk-layer", type=int, default=1)
    made.add_argument("--qk-tokens", type=int, default=32768)
    args = parse(made, smoke={"device": "cpu", "tokens": 256, "check_tokens": 64,
                              "budget_mib": 1, "qk_tokens": 128})
    reason = cuda_missing(args.device)
    if reason:
        skip(reason, device=args.device)
        return 0
    device = torch.device(args.device)
    from real_size import text_of

    from sparsefinder.models.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = _model_folder(args, Path(tmp))
        loaded = load_model(str(folder), alpha=1.5, device=args.device)
        text = text_of(loaded.tokenizer, args.tokens)
        record, extract_s, peak = _supports(loaded, text, args, device)
        n = record.n_tokens
        bits_gib = sum(layer.nbytes for layer in record.layers) / 2**30
        sparsity = record.sparsity()
        print(f"{len(record.layers)} layers x {record.layers[0].heads} heads at n={n}: "
              f"extraction {extract_s:.2f} s, peak {peak:.2f} GiB above the weights, bits "
              f"{bits_gib:.2f} GiB, gold sparsity {sparsity:.4f}", flush=True)
        del record
        if args.save_qk:
            _save_qk(loaded, text_of, args)
        check_n, mismatch, pairs = _check(folder, loaded, text_of, args)
        print(f"check at n={check_n}: {mismatch} of {pairs} pairs differ from the CPU path",
              flush=True)
        del loaded
        if device.type == "cuda":
            torch.cuda.empty_cache()
        sdpa_s = _sdpa_seconds(folder, text, args, device)
    print(f"shape={'tiny-llama' if args.smoke else args.shape} n={n} extract_s={extract_s:.3f} "
          f"sdpa_s={sdpa_s:.4f} ratio={extract_s / sdpa_s:.1f} peak_gib={peak:.3f} "
          f"bits_gib={bits_gib:.3f} gold_sparsity={sparsity:.4f} check_n={check_n} "
          f"check_mismatch={mismatch} check_pairs={pairs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
