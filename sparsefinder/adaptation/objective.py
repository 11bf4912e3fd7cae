"""The distillation objective of an entmax adapter: targets, LoRA targets, the loss, and the
:class:`Distillation` objective that the one training loop runs.

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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sparsefinder.attention.interface import AttentionCall, capture
from sparsefinder.models.pooling import mean_pool
from sparsefinder.training import LayerLog, autograd_gradients

#: Module-name patterns (end of the dotted name) of the BERT-family layers LoRA can target,
#: by group; the FFN output is ``layer.N.output.dense``, not ``attention.output.dense``.
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "attention": (r"attention\.self\.query", r"attention\.self\.key", r"attention\.self\.value",
                  r"attention\.output\.dense"),
    "ffn": (r"intermediate\.dense", r"layer\.\d+\.output\.dense"),
}
CHECKPOINT_NAME = "adapt-checkpoint.pt"
#: The checkpoint's layout: 2 = the one training loop's state (1, unmarked: the adaptation's
#: own loop, not resumable now).
CHECKPOINT_FORMAT = 2


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


def batch_loss(student: Callable[..., Any], batch: Batch, config: AdaptConfig,
               start_entropy: Tensor | None) -> tuple[Tensor, dict[str, float]]:
    """The distillation loss of the module docstring, and its parts (for the progress bar);
    ``student`` is the model, or a call of it with other weights (``functional_call``)."""
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


# ------------------------------------------------------------------------------------------
# The objective of the one training loop: batches by (seed, epoch), the loss, the LoRA tensors
# ------------------------------------------------------------------------------------------


def epoch_order(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The batches of one epoch: a permutation seeded by (seed, epoch), so a resumed run
    sees exactly the batches an uninterrupted one would."""
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    perm = torch.randperm(n, generator=gen).tolist()
    return [perm[i:i + batch_size] for i in range(0, n, batch_size)
            if len(perm[i:i + batch_size]) == batch_size or n < batch_size]


def batch_at(step: int, n: int, batch_size: int, seed: int) -> list[int]:
    """The batch of step ``step`` counted over epochs (what :class:`Distillation` trains on)."""
    per_epoch = max(n // batch_size, 1)
    return epoch_order(n, batch_size, seed, step // per_epoch)[step % per_epoch]


class Distillation:
    """The distillation as an :class:`~sparsefinder.training.Objective` of the one training
    loop: one "layer" is the whole student, its parameters the trainable (LoRA) tensors.

    The loop owns those tensors; the student runs with them through
    :func:`torch.func.functional_call`, and :meth:`load` writes them back into it (at the
    end, and whenever someone is about to look at the student mid-training). Epochs are
    passes over the texts; the batches of epoch ``e`` are :func:`epoch_order` of it (a
    function of the seed and ``e``: no generator to save), cut at ``config.steps`` in all.
    """

    generators: Sequence[torch.Generator] = ()

    def __init__(self, student: nn.Module, targets: Targets, config: AdaptConfig,
                 device: torch.device, entropy0: Tensor) -> None:
        self.student, self.targets, self.config = student, targets, config
        self.device, self.entropy0 = device, entropy0
        self.trained = {name: p for name, p in student.named_parameters() if p.requires_grad}
        self.per_epoch = max(len(targets.ids) // config.batch_size, 1)
        self.epochs = math.ceil(config.steps / self.per_epoch)
        self.batches: list[list[int]] = []
        self.parts: dict[str, float] = {}  # the last step's loss parts

    def start(self, layer: int, device: torch.device) -> bool:
        # Eval mode while training: no dropout, so the student matches the teacher's exact
        # (dropout-free) function, and a resumed run repeats an uninterrupted one bit for bit.
        self.student.eval()
        return True

    def draw(self, epoch: int) -> int:
        left = self.config.steps - epoch * self.per_epoch
        self.batches = epoch_order(len(self.targets.ids), self.config.batch_size,
                                   self.config.seed, epoch)[:left]
        return len(self.batches)

    def init(self) -> list[Tensor]:
        return [p.detach().clone().requires_grad_(True) for p in self.trained.values()]

    def gradients(self, params: list[Tensor], step: int) -> tuple[list[Tensor], Tensor]:
        batch = self.targets.batch(self.batches[step], self.device)
        weights = dict(zip(self.trained, params, strict=True))

        def student(**inputs: Tensor) -> object:
            return torch.func.functional_call(self.student, weights, (), inputs)

        loss, self.parts = batch_loss(student, batch, self.config, self.entropy0)
        return autograd_gradients(loss, params)

    def held_out_loss(self, params: list[Tensor]) -> Tensor:
        raise NotImplementedError("the distillation runs config.steps steps: no early stop")

    def finish(self, params: list[Tensor] | None, log: LayerLog) -> LayerLog:
        if params is not None:
            self.load(params)
        return log

    @torch.no_grad()
    def load(self, params: list[Tensor]) -> None:
        """Write the loop's tensors into the student's own parameters."""
        for mine, trained in zip(self.trained.values(), params, strict=True):
            mine.copy_(trained)
