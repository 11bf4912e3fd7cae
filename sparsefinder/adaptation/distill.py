"""Adapt a softmax-trained model to α-entmax attention by distilling it into itself: the
training run (the objective of :mod:`.objective` on the one loop, :mod:`sparsefinder.training`:
schedule, checkpoints, history), the fidelity measure and the adapter it writes.
"""

from __future__ import annotations

import math
import pickle
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from sparsefinder.adaptation.objective import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    AdaptConfig,
    AdaptError,
    Distillation,
    EntropySink,
    Targets,
    _padded,
    batch_at,
    target_modules,
    teacher_targets,
)
from sparsefinder.attention.interface import AttentionCall, capture
from sparsefinder.data.chunking import chunk_passages
from sparsefinder.files import atomic_write
from sparsefinder.models.adapter_file import base_fingerprint, base_module_name, save_adapter
from sparsefinder.models.loading import LoadedModel
from sparsefinder.models.pooling import mean_pool
from sparsefinder.training import StepEnd, Trainer


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
    """What a run did: its steps, the seconds spent stepping (over every resumed part), and
    the loss parts of every 10th step and of the last."""

    step: int = 0
    seconds: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)


def _load_checkpoint(checkpoint: Path, device: torch.device) -> dict:
    """A training checkpoint, read without running code (``weights_only``: tensors, numbers,
    strings, lists and dicts; the scheduler's lambda is not in its state dict)."""
    try:
        return torch.load(checkpoint, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as error:
        raise AdaptError(f"cannot read the checkpoint {checkpoint}: it is damaged, or holds "
                         "objects other than tensors, numbers and text (not loaded: that could "
                         "run code); delete it, or rerun without --resume to start over"
                         ) from error


def _trained_shapes(student: nn.Module) -> dict[str, list[int]]:
    """The trained tensors by name (a checkpoint is only resumed onto the same ones)."""
    return {name: list(p.shape) for name, p in student.named_parameters() if p.requires_grad}


def _resumable(checkpoint: Path, config: AdaptConfig, shapes: dict[str, list[int]],
               device: torch.device) -> dict:
    """The checkpoint's contents, when it continues this run; else an error saying why."""
    saved = _load_checkpoint(checkpoint, device)
    if saved.get("format") != CHECKPOINT_FORMAT:
        raise AdaptError(f"{checkpoint} was written by an older sparsefinder, whose adaptation "
                         "had its own training loop: it cannot be resumed; delete it, or rerun "
                         "without --resume to start over")
    if saved["config"] != config.as_dict():
        raise AdaptError(
            f"{checkpoint} was written with other settings ({saved['config']}); rerun "
            "with the same options, or without --resume to start over")
    if saved["shapes"] != shapes:
        raise AdaptError(f"{checkpoint} was written for another model (other adapter "
                         "tensors); use another --out folder, or rerun without --resume")
    return saved


def train(student: nn.Module, targets: Targets, config: AdaptConfig, device: torch.device,
          checkpoint: Path | None = None, resume: bool = False,
          on_step: Callable[[int, dict[str, float]], None] | None = None) -> TrainState:
    """Optimise the trainable (LoRA) parameters of ``student`` on the one training loop
    (:class:`~sparsefinder.training.Trainer`: AdamW, warm-up then cosine decay, gradients
    clipped to norm 1); resumable from ``checkpoint``.

    The checkpoint (every ``config.checkpoint_every`` steps and at the end) holds the loop's
    state (the trainable tensors, the optimizer, the schedule, the step), the start
    entropies and the history; a resumed run continues exactly where it stopped (batches
    are a function of the step). ``on_step(step, loss parts)`` sees the student as trained
    so far.
    """
    state = TrainState()
    saved = None
    shapes = _trained_shapes(student)
    if resume and checkpoint is not None and checkpoint.exists():
        saved = _resumable(checkpoint, config, shapes, device)
        state = TrainState(len(saved["trainer"]["losses"]), saved["seconds"], saved["history"])
    entropy0 = saved["entropy0"] if saved is not None else start_entropies(
        student, targets, config, device)
    objective = Distillation(student, targets, config, device, entropy0)
    clock = [time.perf_counter()]

    def step_end(end: StepEnd) -> None:
        state.step = end.step
        state.seconds += time.perf_counter() - clock[0]
        parts = {**objective.parts, "loss": float(end.loss)}
        if state.step % 10 == 0 or state.step == config.steps:
            state.history.append({"step": state.step, **parts})
        if on_step is not None:
            objective.load(end.params)
            on_step(state.step, parts)
        clock[0] = time.perf_counter()

    def save(loop: dict[str, object]) -> None:
        saved = {"format": CHECKPOINT_FORMAT, "config": config.as_dict(),
                 "shapes": shapes, "seconds": state.seconds,
                 "history": list(state.history), "entropy0": entropy0, "trainer": loop}
        atomic_write(checkpoint, lambda handle: torch.save(saved, handle))  # never half-written
        clock[0] = time.perf_counter()

    Trainer(epochs=objective.epochs, device=device,
            optimizer=lambda params: torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0),
            scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda s: lr_factor(s, config)),
            clip_grad_norm=1.0, on_step=step_end,
            checkpoint=None if checkpoint is None else save,
            checkpoint_every=config.checkpoint_every,
            ).fit(objective, 1, resume=None if saved is None else saved["trainer"])
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
