"""The training loop shared by every learned part: early stopping, resuming, the all-reduce hook
and the progress bar, on a toy objective (the real objectives on it:
tests/projections/test_objectives.py, tests/adaptation/test_distill.py)."""

from __future__ import annotations

import io

import pytest
import torch
from tolerances import tol_for

from sparsefinder.training import EarlyStop, LayerLog, Trainer

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


class Toy:
    """Per layer, ``w`` (3,) pulled towards a noisy target around 1 (loss ½‖w − t‖², one new
    target per epoch); held-out loss ‖w − 0.5‖²: it improves while w nears 0.5, then worsens.
    With ``noise``, every gradient also draws noise from the generator (after the epoch's draw).
    """

    def __init__(self, steps: int = 2, skip: tuple[int, ...] = (), noise: float = 0.0) -> None:
        self.generators = [torch.Generator().manual_seed(0)]
        self.steps, self.skip, self.noise = steps, skip, noise
        self.held_out_calls = 0

    def start(self, layer: int, device: torch.device) -> bool:
        return layer not in self.skip

    def draw(self, epoch: int) -> int:
        self.target = 1 + 0.1 * torch.randn(3, generator=self.generators[0])
        return self.steps

    def init(self) -> list[torch.Tensor]:
        return [torch.zeros(3)]

    def gradients(self, params, step):
        diff = params[0] - self.target
        if self.noise:
            diff = diff + self.noise * torch.randn(3, generator=self.generators[0])
        return [diff], 0.5 * diff.square().sum()

    def held_out_loss(self, params) -> torch.Tensor:
        self.held_out_calls += 1
        return (params[0] - 0.5).square().sum()

    def finish(self, params, log: LayerLog):
        return (None if params is None else params[0].detach().clone()), log


def sgd(params):
    return torch.optim.SGD(params, lr=0.15)


# ---------------------------------------------------------------- early stopping


def test_early_stop_triggers_when_the_held_out_loss_stops_improving() -> None:
    toy = Toy()
    (weight, log), = Trainer(epochs=20, optimizer=sgd, early_stop=EarlyStop(patience=2)).fit(
        toy, 1)
    held = log.held_out
    best = min(range(len(held)), key=held.__getitem__)
    assert 2 < log.epochs < 20 and log.stopped  # it ran a while, then stopped early
    assert held[best - 1] > held[best] and held[best + 1] > held[best]  # improved, then not
    assert len(held) == log.epochs == best + 1 + 2  # two epochs without improvement: patience
    assert len(log.losses) == 2 * log.epochs and toy.held_out_calls == log.epochs
    # The best epoch's weights are restored: the same as a run of exactly best + 1 epochs.
    (plain, _), = Trainer(epochs=best + 1, optimizer=sgd).fit(Toy(), 1)
    assert torch.equal(weight, plain)
    (last, log_last), = Trainer(epochs=20, optimizer=sgd, early_stop=EarlyStop(
        patience=2, restore_best=False)).fit(Toy(), 1)
    assert log_last.epochs == log.epochs and not torch.equal(last, weight)
    (never, log_never), = Trainer(epochs=5, optimizer=sgd).fit(Toy(), 1)
    assert log_never.epochs == 5 and not log_never.stopped and log_never.held_out == []


def test_min_delta_counts_small_gains_as_no_improvement() -> None:
    (_, log), = Trainer(epochs=20, optimizer=sgd, early_stop=EarlyStop(min_delta=1e9)).fit(
        Toy(), 1)
    assert log.epochs == 2  # the first epoch sets the best; nothing beats it by 1e9


def test_early_stop_options_are_checked_and_split_records() -> None:
    for bad in ({"held_out": 0.0}, {"held_out": 1.0}, {"patience": 0}, {"min_delta": -1.0}):
        with pytest.raises(ValueError):
            EarlyStop(**bad)
    fit, held = EarlyStop(held_out=0.2).split(list(range(11)))
    assert held == [4, 9] and fit == [0, 1, 2, 3, 5, 6, 7, 8, 10]
    with pytest.raises(ValueError, match="at least 5 records"):
        EarlyStop(held_out=0.2).split([1, 2, 3])


# ---------------------------------------------------------------- resuming


def _roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_resume_from_any_epoch_gives_the_uninterrupted_weights() -> None:
    states: list[dict] = []
    rule = EarlyStop(patience=2)
    options = {"epochs": 8, "lr": 0.1, "early_stop": rule}  # Adam: its moments are state too
    full = Trainer(**options, checkpoint=states.append).fit(Toy(skip=(1,)), 3)
    where = [(s["layer"], s["epoch"], s["stopped"]) for s in states]
    stop = full[0][1].epochs
    assert stop < 8 and where[stop - 1] == (0, stop, True)  # layer 0 stopped early
    assert {layer for layer, _, _ in where} == {0, 2}  # the skipped layer trains nothing
    for state in states:
        again = Trainer(**options).fit(Toy(skip=(1,)), 3, resume=_roundtrip(state))
        for (w, log), (w_full, log_full) in zip(again, full, strict=True):
            assert (w is None and w_full is None) or torch.equal(w, w_full)
            assert log == log_full


def _halving(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))


def test_mid_epoch_checkpoints_resume_to_the_uninterrupted_weights() -> None:
    """With ``checkpoint_every`` the state is taken inside epochs too; a resumed run draws the
    epoch's target again from the generator's state before the draw, goes on with the noise
    drawn after it, and with the schedule's and Adam's state."""
    states: list[dict] = []
    ends: list[tuple[int, int]] = []
    options = {"epochs": 3, "lr": 0.1, "checkpoint_every": 2, "scheduler": _halving}
    full = Trainer(**options, checkpoint=states.append,
                   on_step=lambda end: ends.append((end.layer, end.step))).fit(
        Toy(steps=3, noise=0.1), 2)
    assert ends == [(layer, step) for layer in (0, 1) for step in range(1, 10)]
    # 9 steps a layer: after steps 2, 4 and 8 (inside epochs), 6 (an epoch's end: a multiple
    # of 2) and 9 (the layer's end); steps 3 and 9 end epochs on no multiple of 2.
    where = [(s["layer"], s["epoch"], s["step"]) for s in states]
    assert where == [(layer, epoch, step) for layer in (0, 1)
                     for epoch, step in ((0, 2), (1, 1), (2, 0), (2, 2), (3, 0))]
    for state in states:
        seen: list[tuple[int, int]] = []
        again = Trainer(**options, on_step=lambda end, seen=seen: seen.append(
            (end.layer, end.step))).fit(Toy(steps=3, noise=0.1), 2, resume=_roundtrip(state))
        for (w, log), (w_full, log_full) in zip(again, full, strict=True):
            assert torch.equal(w, w_full) and log == log_full
        assert seen == ends[ends.index((state["layer"], len(state["losses"]))) + 1:]


def test_the_schedule_scales_steps_and_clipping_caps_the_gradient() -> None:
    def halt(optimizer):  # the rate drops to 0 after the first epoch's 2 steps
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: float(step < 2))

    (halted, _), = Trainer(epochs=3, optimizer=sgd, scheduler=halt).fit(Toy(), 1)
    (one, _), = Trainer(epochs=1, optimizer=sgd).fit(Toy(), 1)
    assert torch.equal(halted, one)
    (unhalted, _), = Trainer(epochs=3, optimizer=sgd).fit(Toy(), 1)
    assert not torch.equal(unhalted, one)
    # One step from 0: the gradient is −target (norm ≈ 1.7), clipped to norm 1e-3 (torch
    # scales by max_norm / (norm + 1e-6)), times the rate 0.15.
    target = 1 + 0.1 * torch.randn(3, generator=torch.Generator().manual_seed(0))
    (clipped, _), = Trainer(optimizer=sgd, clip_grad_norm=1e-3).fit(Toy(steps=1), 1)
    wide = target.double()
    expected = 0.15 * wide * (1e-3 / (wide.norm() + 1e-6))
    torch.testing.assert_close(clipped.double(), expected,
                               **tol_for(expected, terms=8, dtype=torch.float32))
    (loose, _), = Trainer(optimizer=sgd, clip_grad_norm=10.0).fit(Toy(steps=1), 1)
    assert torch.equal(loose, 0.15 * target)  # under the cap: the gradient as it is


def test_loop_options_are_checked_and_a_resume_needs_the_same_schedule() -> None:
    for bad in ({"checkpoint_every": 0}, {"checkpoint_every": 1.5}, {"clip_grad_norm": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Trainer(**bad)
    states: list[dict] = []
    Trainer(epochs=2, checkpoint=states.append).fit(Toy(), 1)
    with pytest.raises(ValueError, match="taken with no learning-rate scheduler"):
        Trainer(epochs=2, scheduler=_halving).fit(Toy(), 1, resume=states[0])


# ---------------------------------------------------------------- all-reduce hook


def test_all_reduce_hook_sees_every_step_and_its_result_is_applied() -> None:
    seen: list[torch.Tensor] = []

    def halve(packed: torch.Tensor) -> torch.Tensor:
        seen.append(packed.clone())
        return packed / 2

    (weight, log), = Trainer(epochs=3, optimizer=sgd, all_reduce=halve,
                             early_stop=EarlyStop(patience=5)).fit(Toy(steps=4), 1)
    assert len(seen) == 3 * 4 + 3  # every step, and every held-out loss
    step_packs = [p for p in seen if p.numel() == 4]  # 3 gradient entries + the loss
    assert len(step_packs) == 12
    assert log.losses == pytest.approx([float(p[-1]) / 2 for p in step_packs])
    assert log.held_out == pytest.approx([float(p[0]) / 2 for p in seen if p.numel() == 1])
    # Halved gradients = SGD at half the learning rate.
    (slow, _), = Trainer(epochs=3, optimizer=lambda p: torch.optim.SGD(p, lr=0.075)).fit(
        Toy(steps=4), 1)
    # lr·(g/2) and (lr/2)·g: halving is exact, so only the 12 updates' roundings remain
    torch.testing.assert_close(weight, slow, **tol_for(slow, terms=2 * 12))


# ---------------------------------------------------------------- progress bar


def test_progress_bar_counts_layer_epochs(capsys, monkeypatch) -> None:
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread (forks)
    Trainer(epochs=3, progress=True, desc="toy").fit(Toy(skip=(1,)), 2)
    err = capsys.readouterr().err
    assert "toy" in err and "6/6" in err and "layer·epoch" in err
    Trainer(epochs=20, progress=True, optimizer=sgd, early_stop=EarlyStop()).fit(Toy(), 1)
    assert "20/20" in capsys.readouterr().err  # an early stop completes the bar
    states: list[dict] = []
    Trainer(epochs=3, checkpoint=states.append).fit(Toy(), 2)
    Trainer(epochs=3, progress=True).fit(Toy(), 2, resume=states[3])
    err = capsys.readouterr().err
    assert "4/6" in err and "6/6" in err and "0/6" not in err  # a resumed bar starts at 4
    Trainer(epochs=3).fit(Toy(), 2)
    assert capsys.readouterr().err == ""
