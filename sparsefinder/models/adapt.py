"""Adapt a softmax-trained model to α-entmax attention by distilling it into itself.

Why: a model trained with softmax and *run* with entmax drifts (the default MiniLM's pooled
output has cosine ≈ 0.8 to its softmax self), so its gold graphs belong to a model that no
longer does its job. Here the entmax model (the *student*, with PEFT LoRA adapters) learns to
reproduce the softmax model's (the *teacher*'s) outputs on a corpus, while a penalty keeps its
attention from spreading out (matching softmax by densifying attention would defeat the
purpose: sparsity is what Sparsefinder studies).

Loss per batch (``m`` = token mask, ``h`` = hidden states, ``H`` = attention entropy):

    L = w_tok · mean_tokens(1 - cos(h_L, h_L*))  +  w_pool · mean(1 - cos(pool h_L, pool h_L*))
        + w_layer · mean_{l<L} mean_tokens(1 - cos(h_l, h_l*))
        + w_sparse · mean_{layer, head} relu(H_{layer,head} - H⁰_{layer,head})

``H⁰`` is each head's mean Shannon entropy of the *unadapted* entmax model on the first
training batches: the penalty only bites when a head becomes more spread out than it started.
Gradients flow through ``entmax.entmax15`` (the fast solver is forward-only; the attention
function defers to the package whenever its input needs a gradient).

The adapter file (:mod:`sparsefinder.models.adapter_file`) holds only the LoRA matrices.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from sparsefinder.attention.interface import AttentionCall, capture
from sparsefinder.models.loading import LoadedModel

#: Module-name patterns (end of the dotted name) of the BERT-family layers LoRA can target,
#: by group; the FFN output is ``layer.N.output.dense``, not ``attention.output.dense``.
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "attention": (r"attention\.self\.query", r"attention\.self\.key", r"attention\.self\.value",
                  r"attention\.output\.dense"),
    "ffn": (r"intermediate\.dense", r"layer\.\d+\.output\.dense"),
}
CHECKPOINT_NAME = "adapt-checkpoint.pt"


class AdaptError(ValueError):
    """The adaptation cannot run as asked (bad settings, a model it does not cover, a
    checkpoint from other settings); the message says how to fix it."""


@dataclass
class AdaptConfig:
    """Hyperparameters of one adaptation (all recorded in the checkpoint and the asset)."""

    alpha: float = 1.5
    rank: int = 8
    lora_alpha: float = 16.0
    targets: tuple[str, ...] = ("attention", "ffn")
    steps: int = 400
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 50
    max_tokens: int = 128
    w_tokens: float = 1.0
    w_pooled: float = 1.0
    w_layers: float = 0.5
    w_sparse: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        self.targets = tuple(self.targets)
        unknown = [t for t in self.targets if t not in TARGET_GROUPS]
        if unknown or not self.targets:
            raise AdaptError(f"unknown LoRA target group(s) {unknown or '(none)'}; "
                             f"choose from {', '.join(TARGET_GROUPS)}")
        for name in ("rank", "steps", "batch_size", "max_tokens", "checkpoint_every"):
            if int(getattr(self, name)) < 1:
                raise AdaptError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.alpha <= 1.0:
            raise AdaptError(f"alpha must be > 1 for a sparse model, got {self.alpha}")
        if self.lr <= 0:
            raise AdaptError(f"lr must be > 0, got {self.lr}")

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["targets"] = list(self.targets)
        return out


def target_modules(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """Full names of the linear layers the LoRA adapters go on; an uncovered family is an
    error (the groups name BERT-style modules: query/key/value, intermediate/output)."""
    patterns = [p for group in targets for p in TARGET_GROUPS[group]]
    found = {p: [name for name, module in model.named_modules()
                 if isinstance(module, nn.Linear) and re.search(rf"(^|\.){p}$", name)]
             for p in patterns}
    names = sorted({name for group in found.values() for name in group})
    missing = [p.replace("\\", "") for p, hits in found.items() if not hits]
    if missing:
        family = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise AdaptError(
            f"model family {family!r} is not covered: it has no linear layers named "
            f"*{', *'.join(missing)} (adaptation covers BERT-style encoders such as the "
            "default MiniLM)")
    return names


@dataclass
class Batch:
    input_ids: Tensor
    attention_mask: Tensor
    targets: Tensor  # (layers + 1, batch, n, hidden) teacher hidden states, float16


@dataclass
class Targets:
    """Tokenized training texts and the teacher's hidden states for each (computed once)."""

    ids: list[Tensor]
    hidden: list[Tensor]  # per text (layers + 1, n, hidden) float16
    pad_id: int = 0

    def batch(self, rows: Sequence[int], device: torch.device) -> Batch:
        width = max(len(self.ids[i]) for i in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        first = self.hidden[rows[0]]
        hidden = torch.zeros(first.shape[0], len(rows), width, first.shape[-1],
                             dtype=first.dtype)
        for row, i in enumerate(rows):
            n = len(self.ids[i])
            ids[row, :n], mask[row, :n] = self.ids[i], 1
            hidden[:, row, :n] = self.hidden[i]
        return Batch(ids.to(device), mask.to(device), hidden.to(device))


def _padded(tokenizer, texts: Sequence[str], max_tokens: int) -> dict[str, Tensor]:
    return tokenizer(list(texts), padding=True, truncation=True, max_length=max_tokens,
                     return_tensors="pt")


@torch.no_grad()
def teacher_targets(teacher: nn.Module, tokenizer, texts: Sequence[str], max_tokens: int,
                    device: torch.device, batch_size: int = 16) -> Targets:
    """Every hidden state of the softmax teacher on ``texts`` (stored float16: ~0.8 MB per
    128-token text for MiniLM, so a few hundred texts fit easily)."""
    ids: list[Tensor] = []
    hidden: list[Tensor] = []
    for start in range(0, len(texts), batch_size):
        enc = _padded(tokenizer, texts[start:start + batch_size], max_tokens)
        out = teacher(**{k: v.to(device) for k, v in enc.items()}, output_hidden_states=True)
        states = torch.stack(out.hidden_states).to("cpu", torch.float16)
        for row, length in enumerate(enc["attention_mask"].sum(1).tolist()):
            ids.append(enc["input_ids"][row, :length].clone())
            hidden.append(states[:, row, :length].clone())
    return Targets(ids, hidden, int(tokenizer.pad_token_id or 0))


def _token_cos(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """Mean over real tokens of 1 - cos(a, b); a, b (..., batch, n, d), mask (batch, n)."""
    cos = nn.functional.cosine_similarity(a, b.to(a.dtype), dim=-1)
    m = mask.to(cos.dtype)
    return ((1 - cos) * m).sum((-1, -2)) / m.sum()


def mean_pool(states: Tensor, mask: Tensor) -> Tensor:
    """Mean over real tokens (sentence-transformers' pooling for MiniLM)."""
    m = mask.to(states.dtype).unsqueeze(-1)
    return (states * m).sum(-2) / m.sum(-2).clamp_min(1)


class EntropySink:
    """Collects each head's mean attention entropy (per layer) with its gradient."""

    def __init__(self) -> None:
        self.per_layer: list[Tensor] = []

    def __call__(self, call: AttentionCall) -> None:
        p = call.probs
        ent = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)  # (batch, heads, n)
        rows = call.allowed.any(-1).to(ent.dtype).expand_as(ent)  # real queries
        self.per_layer.append((ent * rows).sum((0, 2)) / rows.sum((0, 2)).clamp_min(1))

    def stacked(self) -> Tensor:
        return torch.stack(self.per_layer)  # (layers, heads)


def batch_loss(student: nn.Module, batch: Batch, config: AdaptConfig,
               start_entropy: Tensor | None) -> tuple[Tensor, dict[str, float]]:
    """The distillation loss of the module docstring, and its parts (for the progress bar)."""
    sink = EntropySink()
    with capture(sink):
        out = student(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      output_hidden_states=True)
    states = torch.stack(out.hidden_states)
    mask = batch.attention_mask
    tok = _token_cos(states[-1], batch.targets[-1], mask)
    pooled = 1 - nn.functional.cosine_similarity(
        mean_pool(states[-1], mask), mean_pool(batch.targets[-1].to(states.dtype), mask), dim=-1
    ).mean()
    layers = _token_cos(states[1:-1], batch.targets[1:-1], mask).sum() / max(len(states) - 2, 1)
    entropy = sink.stacked()
    sparse = (torch.relu(entropy - start_entropy).mean() if start_entropy is not None
              else entropy.new_zeros(()))
    loss = (config.w_tokens * tok + config.w_pooled * pooled + config.w_layers * layers
            + config.w_sparse * sparse)
    parts = {name: float(value.detach()) for name, value in
             (("tok", tok), ("pool", pooled), ("layer", layers), ("ent+", sparse))}
    return loss, parts


def epoch_order(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The batches of one epoch: a permutation seeded by (seed, epoch), so a resumed run
    sees exactly the batches an uninterrupted one would."""
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    perm = torch.randperm(n, generator=gen).tolist()
    return [perm[i:i + batch_size] for i in range(0, n, batch_size)
            if len(perm[i:i + batch_size]) == batch_size or n < batch_size]


def batch_at(step: int, n: int, batch_size: int, seed: int) -> list[int]:
    per_epoch = max(n // batch_size, 1)
    return epoch_order(n, batch_size, seed, step // per_epoch)[step % per_epoch]


def lr_factor(step: int, config: AdaptConfig) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak."""
    if step < config.warmup:
        return (step + 1) / config.warmup
    progress = (step - config.warmup) / max(config.steps - config.warmup, 1)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0)))


@torch.no_grad()
def start_entropies(student: nn.Module, targets: Targets, config: AdaptConfig,
                    device: torch.device, batches: int = 8) -> Tensor:
    """Per-(layer, head) mean entropy of the model before adaptation (its LoRA B is zero)."""
    total = None
    for b in range(batches):
        rows = batch_at(b, len(targets.ids), config.batch_size, config.seed + 1)
        sink = EntropySink()
        batch = targets.batch(rows, device)
        with capture(sink):
            student(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        total = sink.stacked() if total is None else total + sink.stacked()
    return total / batches


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)


def train(student: nn.Module, targets: Targets, config: AdaptConfig, device: torch.device,
          checkpoint: Path | None = None, resume: bool = False,
          on_step: Callable[[int, dict[str, float]], None] | None = None) -> TrainState:
    """Optimise the trainable (LoRA) parameters of ``student``; resumable from ``checkpoint``.

    The checkpoint (every ``config.checkpoint_every`` steps and at the end) holds the
    trainable tensors, the optimizer, the step and the start entropies; a resumed run
    continues exactly where it stopped (batches are a function of the step).
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config))
    state = TrainState()
    entropy0: Tensor | None = None
    if resume and checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location=device, weights_only=False)
        if saved["config"] != config.as_dict():
            raise AdaptError(
                f"{checkpoint} was written with other settings ({saved['config']}); rerun "
                "with the same options, or without --resume to start over")
        set_peft_model_state_dict(student, saved["adapter"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        entropy0 = saved["entropy0"]
        state = TrainState(saved["step"], saved["seconds"], saved["history"])
    if entropy0 is None:
        entropy0 = start_entropies(student, targets, config, device)

    def save() -> None:
        if checkpoint is None:
            return
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint.with_suffix(".tmp")
        torch.save({"config": config.as_dict(), "step": state.step, "seconds": state.seconds,
                    "history": state.history, "entropy0": entropy0,
                    "adapter": get_peft_model_state_dict(student),
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                   tmp)
        tmp.replace(checkpoint)  # never a half-written checkpoint

    # Eval mode while training: no dropout, so the student matches the teacher's exact
    # (dropout-free) function, and a resumed run repeats an uninterrupted one bit for bit.
    student.eval()
    while state.step < config.steps:
        began = time.perf_counter()
        rows = batch_at(state.step, len(targets.ids), config.batch_size, config.seed)
        loss, parts = batch_loss(student, targets.batch(rows, device), config, entropy0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        state.step += 1
        state.seconds += time.perf_counter() - began
        parts["loss"] = float(loss.detach())
        if state.step % 10 == 0 or state.step == config.steps:
            state.history.append({"step": state.step, **parts})
        if on_step is not None:
            on_step(state.step, parts)
        if state.step % config.checkpoint_every == 0 or state.step == config.steps:
            save()
    return state


# ------------------------------------------------------------------------------------------
# Measuring fidelity and sparsity
# ------------------------------------------------------------------------------------------


@dataclass
class Fidelity:
    """Pooled cosine to the softmax model per text, and gold sparsity per layer."""

    cosines: Tensor  # (texts,)
    layer_sparsity: Tensor  # (layers,) macro: per (layer, head) mean over texts, then heads

    @property
    def mean_cosine(self) -> float:
        return float(self.cosines.mean())

    @property
    def min_cosine(self) -> float:
        return float(self.cosines.min())

    @property
    def sparsity(self) -> float:
        return float(self.layer_sparsity.mean())

    def summary(self) -> dict[str, object]:
        return {"mean_cosine": round(self.mean_cosine, 4), "min_cosine": round(self.min_cosine, 4),
                "gold_sparsity": round(self.sparsity, 4), "texts": len(self.cosines),
                "layer_sparsity": [round(float(s), 4) for s in self.layer_sparsity]}


@torch.no_grad()
def measure(student: nn.Module, teacher: nn.Module, tokenizer, texts: Sequence[str],
            device: torch.device, max_tokens: int = 512, batch_size: int = 8) -> Fidelity:
    """Mean-pooled cosine of ``student`` to ``teacher`` per text, and the student's gold
    sparsity (1 - |support| / n², per text and head; macro-averaged as :mod:`metrics`)."""
    student.eval()
    cosines: list[Tensor] = []
    sparsity: list[Tensor] = []  # per text (layers, heads)
    for start in range(0, len(texts), batch_size):
        enc = _padded(tokenizer, texts[start:start + batch_size], max_tokens)
        enc = {k: v.to(device) for k, v in enc.items()}
        mask = enc["attention_mask"]
        lengths = mask.sum(1).to(torch.float64)
        per_layer: list[Tensor] = []

        real = (mask[:, None, :, None] * mask[:, None, None, :]).bool()  # real (query, key)

        def sink(call: AttentionCall, per_layer=per_layer, lengths=lengths, real=real) -> None:
            support = ((call.probs > 0) & real).sum((-1, -2)).to(torch.float64)
            per_layer.append(1 - support / lengths[:, None] ** 2)  # (batch, heads)

        with capture(sink):
            out = student(**enc)
        reference = teacher(**enc).last_hidden_state
        cosines.append(nn.functional.cosine_similarity(
            mean_pool(out.last_hidden_state, mask), mean_pool(reference, mask), dim=-1).cpu())
        sparsity.append(torch.stack(per_layer, 1).cpu())  # (batch, layers, heads)
    per_text = torch.cat(sparsity)
    return Fidelity(torch.cat(cosines).to(torch.float64), per_text.mean(0).mean(-1))


# ------------------------------------------------------------------------------------------
# The whole run: teacher targets, LoRA student, training, measurement, the adapter file
# ------------------------------------------------------------------------------------------


def softmax_teacher(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` running its own softmax attention (the distillation target)."""
    import copy

    teacher = copy.deepcopy(model)
    teacher.set_attn_implementation("sdpa")
    for param in teacher.parameters():
        param.requires_grad_(False)
    return teacher.eval()


def lora_student(model: nn.Module, config: AdaptConfig) -> nn.Module:
    """``model`` (already on entmax attention) wrapped with trainable LoRA adapters (PEFT);
    the base weights stay frozen."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=config.rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=target_modules(model, config.targets))
    torch.manual_seed(config.seed)  # LoRA's A starts random: the same seed, the same start
    with warnings.catch_warnings():  # PEFT calls a transformers API that 5.x deprecates
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(model, lora)


def adapter_metadata(student: nn.Module, config: AdaptConfig, base_model: str,
                     model_type: str, extra: dict[str, object]) -> dict[str, object]:
    """What the adapter file records: base model and fingerprint, α, LoRA settings, and
    whatever the caller adds (training data, measured fidelity/sparsity, the command)."""
    from peft import get_peft_model_state_dict

    from sparsefinder.models.adapter_file import base_fingerprint, base_module_name

    modules = dict(student.get_base_model().named_modules())
    # PEFT wraps each target; the frozen base weight sits at `<name>.base_layer`.
    names = {base_module_name(key) for key in get_peft_model_state_dict(student)}
    weights = {name: getattr(modules[name], "base_layer", modules[name]).weight
               for name in names}
    fingerprint = base_fingerprint(weights)
    return {"base_model": base_model, "model_type": model_type,
            "base_fingerprint": fingerprint, "alpha": str(config.alpha),
            "rank": str(config.rank), "lora_alpha": str(config.lora_alpha),
            "targets": list(config.targets), "config": config.as_dict(), **extra}


@dataclass
class AdaptResult:
    """What one adaptation produced: the adapter file, its measurements and the time."""

    path: Path
    before: Fidelity
    after: Fidelity
    state: TrainState
    metadata: dict[str, object]


def adapt_model(
    base: LoadedModel,
    train_texts: Sequence[str],
    eval_texts: Sequence[str],
    config: AdaptConfig,
    out: Path,
    *,
    base_name: str,
    data_label: str,
    command: str = "",
    resume: bool = False,
    choose_texts: Sequence[str] = (),
    filename: str = "entmax_adapter.safetensors",
    measure_every: int = 0,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> AdaptResult:
    """Distil ``base``'s softmax self into its entmax self on ``train_texts`` (chunked to
    ``config.max_tokens``), measure pooled cosine and gold sparsity on ``eval_texts`` before
    and after, and write the adapter (with all of that in its metadata) to ``out/filename``.

    ``choose_texts`` (train passages held out of training) are measured after training too:
    settings are compared on them, never on ``eval_texts``.

    With ``measure_every`` > 0 the held-out texts are also measured every so many steps:
    the fidelity/sparsity trade-off along training (in the metadata as ``curve``).

    ``base`` must be loaded WITHOUT an adapter (``load_model("default-softmax")``) with the
    entmax attention on; it is modified in place (LoRA layers are added).
    """
    from peft import get_peft_model_state_dict

    from sparsefinder.data.corpus import chunk_passages
    from sparsefinder.models.adapter_file import save_adapter

    if base.adapter is not None:
        raise AdaptError("adapt the model's own weights, not an already adapted model: load "
                         "'default-softmax' (or the model without adapter=)")
    if not train_texts:
        raise AdaptError("no training texts: give a corpus with a non-empty train split")
    target_modules(base.model, config.targets)  # an uncovered family fails before any work
    device = base.device
    teacher = softmax_teacher(base.model)
    max_tokens = min(config.max_tokens, base.max_length)
    chunks = chunk_passages(list(train_texts), base.tokenizer, max_tokens)
    targets = teacher_targets(teacher, base.tokenizer, chunks, max_tokens, device)
    student = lora_student(base.model, config)
    before = measure(student, teacher, base.tokenizer, eval_texts, device, base.max_length)
    curve: list[dict[str, object]] = []

    def step_hook(step: int, parts: dict[str, float]) -> None:
        if on_step is not None:
            on_step(step, parts)
        if measure_every > 0 and choose_texts and step % measure_every == 0:
            point = measure(student, teacher, base.tokenizer, choose_texts, device,
                            base.max_length).summary()
            curve.append({"step": step, **point})
            if on_step is not None:
                on_step(step, {"held_out_cos": point["mean_cosine"],
                               "held_out_sparsity": point["gold_sparsity"]})

    state = train(student, targets, config, device, checkpoint=out / CHECKPOINT_NAME,
                  resume=resume, on_step=step_hook)
    after = measure(student, teacher, base.tokenizer, eval_texts, device, base.max_length)
    held_out = (measure(student, teacher, base.tokenizer, choose_texts, device,
                        base.max_length).summary() if choose_texts else None)
    metadata = adapter_metadata(student, config, base_name,
                                str(getattr(base.model.config, "model_type", "")), {
        "training_data": data_label, "training_chunks": len(chunks),
        "train_seconds": round(state.seconds, 1),
        "before": before.summary(), "after": after.summary(), "held_out_train": held_out,
        "curve": curve, "command": command,
    })
    path = save_adapter(out / filename, get_peft_model_state_dict(student), metadata)
    return AdaptResult(path, before, after, state, metadata)
