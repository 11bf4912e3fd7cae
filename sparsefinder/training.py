"""One training loop for every learned part: per layer, epochs of batches and optimizer steps.

The projections (:mod:`~sparsefinder.projections.hinge`, :mod:`~sparsefinder.projections.logistic`,
:mod:`~sparsefinder.projections.bilinear`, :mod:`~sparsefinder.projections.blocks`), their
data-parallel training (:mod:`~sparsefinder.projections.data_parallel`) and the HashAttention
codes (:mod:`~sparsefinder.projections.hash_fit`) differ only in what they learn and how they
score a batch. Each supplies those hooks as an :class:`Objective`; :class:`Trainer` does the
rest, the same way for all of them:

- per layer: ``objective.start`` (the layer's data), then per epoch ``objective.draw`` (its
  batches: negatives, shuffling), ``objective.init`` once (the starting parameters, after the
  first draw, which they may be estimated from), one optimizer step per batch on the gradients
  of ``objective.gradients``, and at the end ``objective.finish`` (the layer's result);
- an optimizer (Adam by default) built per layer on the parameters, on a ``device``, with an
  optional learning-rate ``scheduler`` (stepped after every optimizer step) and gradient-norm
  clipping (``clip_grad_norm``, on the reduced gradients);
- an optional early stop on a held-out part of TRAIN (:class:`EarlyStop`: the objective scores
  its held-out pairs after every epoch; the loop stops when that loss stops improving);
- an ``all_reduce`` hook: the gradients and the loss of every step (and the held-out loss) are
  packed into one flat tensor and passed through it, e.g. the mean over data-parallel ranks;
- resumable state: ``checkpoint`` receives a state dict after every epoch, or with
  ``checkpoint_every`` after every so many steps of a layer and at its end (parameters,
  optimizer, scheduler, random generators, losses, the results of finished layers);
  ``resume=state`` continues from it to the same weights as an uninterrupted run (mid-epoch
  too: the epoch's batches are drawn again from the generators' state before its draw);
- an ``on_step`` hook after every optimizer step (:class:`StepEnd`: a log line, a measure);
- a tqdm progress bar counting layer·epochs.

The loop draws nothing itself: every random number comes from the objective's generators, so a
seed gives the same result whatever loop options are on (early stopping aside: it changes how
many epochs run).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor
from tqdm.auto import tqdm

OptimizerFactory = Callable[[list[Tensor]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


@dataclass
class LayerLog:
    """What the loop saw while training one layer (handed to ``Objective.finish``)."""

    losses: list[float] = field(default_factory=list)  # training loss of every step
    held_out: list[float] = field(default_factory=list)  # held-out loss after every epoch
    epochs: int = 0  # epochs run (fewer than asked after an early stop)
    stopped: bool = False  # True when early stopping ended the layer

    def tails(self) -> tuple[float, float]:
        """Mean loss of the first and of the last 10 % of steps (NaN without any step)."""
        losses = self.losses or [math.nan]
        tail = max(1, len(losses) // 10)
        return sum(losses[:tail]) / tail, sum(losses[-tail:]) / tail


@dataclass(frozen=True)
class EarlyStop:
    """Stop a layer when its held-out loss has not improved for ``patience`` epochs.

    ``held_out``: the fraction of the TRAIN records an objective keeps out of training to
    score (every ``round(1 / held_out)``-th record); ``min_delta``: the least decrease that
    counts as an improvement; ``restore_best``: end with the parameters of the best epoch.
    """

    held_out: float = 0.2
    patience: int = 1
    min_delta: float = 0.0
    restore_best: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.held_out < 1.0:
            raise ValueError(f"held_out must be a fraction in (0, 1), got {self.held_out!r}")
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) \
                or self.patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {self.patience!r}")
        if not (self.min_delta >= 0.0 and math.isfinite(self.min_delta)):
            raise ValueError(f"min_delta must be a finite number >= 0, got {self.min_delta!r}")

    def split(self, records: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """(records to fit, held-out records): every ``round(1 / held_out)``-th is held out."""
        every = max(2, round(1 / self.held_out))
        held = list(records[every - 1::every])
        fit = [r for i, r in enumerate(records) if (i + 1) % every]
        if not held or not fit:
            raise ValueError(f"early stopping holds out every {every}th record: pass at least "
                             f"{every} records (got {len(records)})")
        return fit, held


class Objective(Protocol):
    """The hooks of one learned part; :meth:`Trainer.fit` calls them in this order."""

    #: Every random generator the hooks draw from (saved and restored with the state).
    generators: Sequence[torch.Generator]

    def start(self, layer: int, device: torch.device) -> bool:
        """Prepare the layer's data; False: nothing to train (``finish`` gets no parameters)."""
        ...

    def draw(self, epoch: int) -> int:
        """Draw the epoch's batches (negatives, shuffling); returns its number of steps."""
        ...

    def init(self) -> list[Tensor]:
        """The layer's starting parameters (called once, after the first ``draw``)."""
        ...

    def gradients(self, params: list[Tensor], step: int) -> tuple[list[Tensor], Tensor]:
        """The gradient of every parameter and the loss (0-dim) on batch ``step``."""
        ...

    def held_out_loss(self, params: list[Tensor]) -> Tensor:
        """The loss (0-dim) on the held-out records (only called with early stopping)."""
        ...

    def finish(self, params: list[Tensor] | None, log: LayerLog) -> Any:
        """The layer's result from its final parameters (None when ``start`` said False)."""
        ...


@dataclass(frozen=True)
class StepEnd:
    """What ``Trainer.on_step`` is shown after an optimizer step (the tensors are the loop's
    own: read them, do not change them)."""

    layer: int
    step: int  # steps done in this layer, this one included (1 after the first)
    loss: Tensor  # 0-dim: this step's loss (reduced over workers)
    params: list[Tensor]  # the parameters after the step


def autograd_gradients(loss: Tensor, params: list[Tensor]) -> tuple[list[Tensor], Tensor]:
    """``Objective.gradients`` of a loss built with autograd (parameters that require grad)."""
    return list(torch.autograd.grad(loss, params)), loss.detach()


@dataclass
class _Progress:
    """Where the loop is inside a layer (what a checkpoint records)."""

    params: list[Tensor] | None = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    epoch: int = 0  # epochs done
    step: int = 0  # steps done in the epoch being trained
    done: int = 0  # steps done in the layer (one loss each in the log)
    drawn_from: list[Tensor] | None = None  # generator states before this epoch's draw
    after_draw: list[Tensor] | None = None  # on a mid-epoch resume: their states to go on from
    best: float = math.inf
    bad: int = 0
    best_params: list[Tensor] | None = None


@dataclass
class Trainer:
    """The loop (see the module docstring); ``fit`` returns ``objective.finish`` per layer.

    ``optimizer`` builds the optimizer of a layer from its parameters (default
    ``torch.optim.Adam(params, lr=lr)``); ``scheduler`` builds its learning-rate schedule
    from the optimizer; ``clip_grad_norm`` caps the gradients' total 2-norm; ``all_reduce``
    maps a flat tensor to its reduction over workers (e.g. the mean over data-parallel
    ranks); ``checkpoint`` is called with the state after every epoch, or with
    ``checkpoint_every`` after every so many steps of a layer and at its end; ``on_step`` is
    called after every optimizer step.
    """

    epochs: int = 1
    lr: float = 0.01
    optimizer: OptimizerFactory | None = None
    device: torch.device | str = "cpu"
    progress: bool = False
    desc: str = "training"
    unit: str = "layer·epoch"
    early_stop: EarlyStop | None = None
    all_reduce: Callable[[Tensor], Tensor] | None = None
    checkpoint: Callable[[dict[str, Any]], None] | None = None
    checkpoint_every: int | None = None
    scheduler: SchedulerFactory | None = None
    clip_grad_norm: float | None = None
    on_step: Callable[[StepEnd], None] | None = None

    def __post_init__(self) -> None:
        every = self.checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                                  or every < 1):
            raise ValueError(f"checkpoint_every must be a number of steps >= 1 (or None: "
                             f"after every epoch), got {every!r}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm must be > 0 (or None: no clipping), "
                             f"got {self.clip_grad_norm!r}")

    def fit(self, objective: Objective, layers: int, resume: dict[str, Any] | None = None
            ) -> list[Any]:
        """Train ``layers`` layers; with ``resume`` (a ``checkpoint`` state of the same
        objective and options), continue where that state was taken."""
        results: list[Any] = list(resume["results"]) if resume is not None else []
        done = resume["layer"] * self.epochs + resume["epoch"] if resume is not None else 0
        bar = tqdm(total=layers * self.epochs, initial=done, desc=self.desc, unit=self.unit,
                   disable=not self.progress)
        try:
            for layer in range(len(results), layers):
                here = resume if resume is not None and resume["layer"] == layer else None
                results.append(self._layer(objective, layer, bar, results, here))
        finally:
            bar.close()
        return results

    def _layer(self, objective: Objective, layer: int, bar: tqdm, results: list[Any],
               resume: dict[str, Any] | None) -> Any:
        device = torch.device(self.device)
        log = LayerLog()
        if not objective.start(layer, device):
            bar.update(self.epochs)
            return objective.finish(None, log)
        run = _Progress() if resume is None else self._restore(objective, resume, log, device)
        every = self.checkpoint_every
        while run.epoch < self.epochs and not log.stopped:
            steps = self._draw(objective, run)
            if run.params is None:
                run.params = [_place(p, device) for p in objective.init()]
                run.optimizer, run.scheduler = self._optimizer(run.params)
            pending: list[Tensor] = []  # losses not yet in the log (one sync per epoch)
            while run.step < steps:
                pending.append(self._step(objective, run, run.step))
                run.step, run.done = run.step + 1, run.done + 1
                if self.on_step is not None:
                    self.on_step(StepEnd(layer, run.done, pending[-1], run.params))
                if (self.checkpoint is not None and every is not None and run.step < steps
                        and run.done % every == 0):
                    log.losses += _flush(pending)
                    self.checkpoint(self._state(objective, layer, run, log, results))
            log.losses += _flush(pending)
            run.epoch, run.step = run.epoch + 1, 0
            log.epochs = run.epoch
            bar.update(1)
            if self.early_stop is not None:
                self._held_out(objective, run, log)
            if self.checkpoint is not None and (
                    every is None or run.done % every == 0 or run.epoch >= self.epochs
                    or log.stopped):
                self.checkpoint(self._state(objective, layer, run, log, results))
        if log.stopped:
            bar.update(self.epochs - run.epoch)
        return objective.finish(run.params, log)

    def _draw(self, objective: Objective, run: _Progress) -> int:
        """The epoch's batches; with mid-epoch checkpoints, the generators' states before the
        draw are kept (a resumed run draws the same batches from them, then goes on)."""
        if self.checkpoint_every is not None:
            run.drawn_from = [g.get_state() for g in objective.generators]
        steps = objective.draw(run.epoch)
        if run.after_draw is not None:
            for generator, saved in zip(objective.generators, run.after_draw, strict=True):
                generator.set_state(saved)
            run.after_draw = None
        return steps

    def _optimizer(self, params: list[Tensor]
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
        optimizer = (self.optimizer(params) if self.optimizer is not None
                     else torch.optim.Adam(params, lr=self.lr))
        return optimizer, None if self.scheduler is None else self.scheduler(optimizer)

    def _step(self, objective: Objective, run: _Progress, step: int) -> Tensor:
        params = run.params
        grads, loss = objective.gradients(params, step)
        if self.all_reduce is not None:
            packed = self.all_reduce(torch.cat([g.reshape(-1) for g in grads]
                                               + [loss.reshape(1)]))
            sizes = [p.numel() for p in params]
            grads = [g.view_as(p) for g, p in zip(packed[:-1].split(sizes), params, strict=True)]
            loss = packed[-1]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
        run.optimizer.step()
        if run.scheduler is not None:
            run.scheduler.step()
        return loss.detach()

    def _held_out(self, objective: Objective, run: _Progress, log: LayerLog) -> None:
        rule = self.early_stop
        with torch.no_grad():
            loss = objective.held_out_loss(run.params).detach().reshape(1)
        if self.all_reduce is not None:
            loss = self.all_reduce(loss)
        value = float(loss[0])
        log.held_out.append(value)
        if value < run.best - rule.min_delta:
            run.best, run.bad = value, 0
            run.best_params = [p.detach().clone() for p in run.params]
        else:
            run.bad += 1
        if run.bad >= rule.patience:
            log.stopped = True
            if rule.restore_best and run.best_params is not None:
                with torch.no_grad():
                    for p, best in zip(run.params, run.best_params, strict=True):
                        p.copy_(best)

    def _state(self, objective: Objective, layer: int, run: _Progress, log: LayerLog,
               results: list[Any]) -> dict[str, Any]:
        """Everything a resumed run needs (copies: later steps do not change it)."""
        return {
            "layer": layer, "epoch": run.epoch, "step": run.step, "stopped": log.stopped,
            "params": [p.detach().cpu().clone() for p in run.params],
            "requires_grad": [p.requires_grad for p in run.params],
            "optimizer": copy.deepcopy(run.optimizer.state_dict()),
            "scheduler": None if run.scheduler is None
            else copy.deepcopy(run.scheduler.state_dict()),
            "generators": [g.get_state() for g in objective.generators],
            "drawn_from": list(run.drawn_from) if run.step else None,
            "losses": list(log.losses), "held_out": list(log.held_out),
            "best": run.best, "bad": run.bad,
            "best_params": None if run.best_params is None
            else [p.cpu().clone() for p in run.best_params],
            "results": list(results),
        }

    def _restore(self, objective: Objective, state: dict[str, Any], log: LayerLog,
                 device: torch.device) -> _Progress:
        params = [p.detach().to(device, copy=True).requires_grad_(grad)
                  for p, grad in zip(state["params"], state["requires_grad"], strict=True)]
        # The schedule is built first (it sets the starting rate), then both states loaded.
        optimizer, scheduler = self._optimizer(params)
        optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        if (scheduler is None) != (state.get("scheduler") is None):
            had = "no" if scheduler is not None else "a"
            raise ValueError(f"the state was taken with {had} learning-rate scheduler: "
                             "resume with the options it was taken with")
        if scheduler is not None:
            scheduler.load_state_dict(copy.deepcopy(state["scheduler"]))
        step = state.get("step", 0)  # states of epoch ends (and older ones) have no step
        mid_epoch = step > 0
        for generator, saved in zip(objective.generators,
                                    state["drawn_from"] if mid_epoch else state["generators"],
                                    strict=True):
            generator.set_state(saved)
        log.losses, log.held_out = list(state["losses"]), list(state["held_out"])
        log.epochs, log.stopped = state["epoch"], state["stopped"]
        best = state["best_params"]
        return _Progress(params=params, optimizer=optimizer, scheduler=scheduler,
                         epoch=state["epoch"], step=step, done=len(state["losses"]),
                         after_draw=state["generators"] if mid_epoch else None,
                         best=state["best"], bad=state["bad"],
                         best_params=None if best is None else [p.to(device) for p in best])


def _flush(pending: list[Tensor]) -> list[float]:
    """The pending losses as numbers (one device sync), emptying the list."""
    values = torch.stack(pending).tolist() if pending else []
    pending.clear()
    return values


def _place(param: Tensor, device: torch.device) -> Tensor:
    """A starting parameter on ``device``, contiguous, a leaf (requires grad if it did)."""
    return param.detach().to(device).contiguous().requires_grad_(param.requires_grad)
