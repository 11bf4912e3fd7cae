"""Adaptation on a tiny random BERT: loss parts, resumable training, measurement, errors."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.adaptation.distill import lora_student, measure, softmax_teacher, train
from sparsefinder.adaptation.objective import (
    AdaptConfig,
    AdaptError,
    batch_at,
    target_modules,
    teacher_targets,
)
from sparsefinder.models.loading import load_model

TEXTS = [
    "The cat sat on the mat while the dog slept by the door.",
    "Functions return values; a missing return statement returns None.",
    "Every object has an identity, a type and a value.",
    "Names refer to objects and are introduced by name binding operations.",
    "A module is a file containing Python definitions and statements.",
    "Exceptions are raised when an error is detected during execution.",
]


def _setup(folder, **overrides):
    settings = {"rank": 2, "steps": 4, "batch_size": 2, "max_tokens": 24, "warmup": 1,
                "checkpoint_every": 2, **overrides}
    config = AdaptConfig(**settings)
    base = load_model(str(folder), device="cpu")
    teacher = softmax_teacher(base.model)
    targets = teacher_targets(teacher, base.tokenizer, TEXTS, config.max_tokens, base.device)
    return config, base, teacher, targets, lora_student(base.model, config)


def _lora(student):
    return {k: v.detach().clone() for k, v in student.named_parameters() if "lora_" in k}


def test_resumed_training_equals_an_uninterrupted_run(tiny_model_dirs, tmp_path):
    folder = tiny_model_dirs["bert"]
    config, _, _, targets, straight = _setup(folder)
    state = train(straight, targets, config, torch.device("cpu"))
    assert state.step == 4
    config2, _, _, targets2, first = _setup(folder)
    half = AdaptConfig(**{**config2.as_dict(), "targets": config2.targets})
    ckpt = tmp_path / "ckpt.pt"
    # Stop after 2 of 4 steps (the checkpoint is written at step 2), then resume.
    with pytest.raises(KeyboardInterrupt):
        train(first, targets2, half, torch.device("cpu"), checkpoint=ckpt,
              on_step=lambda step, parts: _stop_at(step, 3))
    config3, _, _, targets3, resumed = _setup(folder)
    state = train(resumed, targets3, config3, torch.device("cpu"), checkpoint=ckpt, resume=True)
    assert state.step == 4
    for (name, a), b in zip(_lora(straight).items(), _lora(resumed).values(), strict=True):
        assert torch.equal(a, b), name  # the same steps from the same saved state: exact
    assert any(v.abs().sum() > 0 for k, v in _lora(resumed).items() if "lora_B" in k)


def _stop_at(step, at):
    if step == at:
        raise KeyboardInterrupt


def test_resume_with_other_settings_is_refused(tiny_model_dirs, tmp_path):
    config, _, _, targets, student = _setup(tiny_model_dirs["bert"])
    train(student, targets, config, torch.device("cpu"), checkpoint=tmp_path / "c.pt")
    config2, _, _, targets2, student2 = _setup(tiny_model_dirs["bert"], lr=5e-4)
    with pytest.raises(AdaptError, match="other settings"):
        train(student2, targets2, config2, torch.device("cpu"), checkpoint=tmp_path / "c.pt",
              resume=True)


class _RunsOnLoad:
    """A pickled object whose loading would call ``print`` (code run by a checkpoint)."""

    def __reduce__(self):
        return (print, ("code ran while loading a checkpoint",))


def test_a_checkpoint_is_loaded_without_running_code(tiny_model_dirs, tmp_path, capsys):
    config, _, _, targets, student = _setup(tiny_model_dirs["bert"])
    bad = tmp_path / "c.pt"
    torch.save({"config": config.as_dict(), "payload": _RunsOnLoad()}, bad)
    with pytest.raises(AdaptError, match="cannot read the checkpoint.*without --resume"):
        train(student, targets, config, torch.device("cpu"), checkpoint=bad, resume=True)
    assert "code ran" not in capsys.readouterr().out
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(AdaptError, match="cannot read the checkpoint"):
        train(student, targets, config, torch.device("cpu"), checkpoint=bad, resume=True)


def test_an_old_checkpoint_is_refused_with_how_to_go_on(tiny_model_dirs, tmp_path):
    """A checkpoint of the adaptation's former own loop (no format mark, the adapter and the
    optimizer at the top) cannot continue on the one training loop: say so, and how."""
    config, _, _, targets, student = _setup(tiny_model_dirs["bert"])
    old = tmp_path / "c.pt"
    torch.save({"config": config.as_dict(), "step": 2, "seconds": 1.0, "history": [],
                "entropy0": torch.zeros(2, 2), "adapter": _lora(student), "optimizer": {},
                "scheduler": {}}, old)
    with pytest.raises(AdaptError, match="older sparsefinder.*delete it, or rerun without "
                                         "--resume"):
        train(student, targets, config, torch.device("cpu"), checkpoint=old, resume=True)
    train(student, targets, config, torch.device("cpu"), checkpoint=old)  # starting over: fine
    _, _, _, targets2, other = _setup(tiny_model_dirs["bert"], rank=3)
    saved = torch.load(old, weights_only=True)
    saved["config"] = AdaptConfig(**{**config.as_dict(), "rank": 3}).as_dict()
    torch.save(saved, old)  # the same settings, but rank-2 tensors for a rank-3 student
    with pytest.raises(AdaptError, match="another model"):
        train(other, targets2, AdaptConfig(**saved["config"]), torch.device("cpu"),
              checkpoint=old, resume=True)


def test_on_step_sees_the_student_as_trained_so_far(tiny_model_dirs):
    config, _, _, targets, student = _setup(tiny_model_dirs["bert"])
    seen = []
    state = train(student, targets, config, torch.device("cpu"),
                  on_step=lambda step, parts: seen.append((step, parts, _lora(student))))
    assert [step for step, _, _ in seen] == [1, 2, 3, 4] and state.step == 4
    assert set(seen[0][1]) == {"tok", "pool", "layer", "ent+", "loss"}
    moved = [any(not torch.equal(a, b) for a, b in zip(x.values(), y.values(), strict=True))
             for (_, _, x), (_, _, y) in zip(seen, seen[1:], strict=False)]
    assert all(moved)  # every step changed the student the hook looks at
    assert all(torch.equal(a, b) for a, b in zip(seen[-1][2].values(), _lora(student).values(),
                                                 strict=True))
    assert state.history == [{"step": 4, **seen[-1][1]}]  # every 10th step, and the last


def test_training_moves_toward_the_teacher_and_measure_counts_support(tiny_model_dirs):
    config, base, teacher, targets, student = _setup(tiny_model_dirs["bert"], steps=30,
                                                     lr=5e-3)
    before = measure(student, teacher, base.tokenizer, TEXTS, base.device)
    train(student, targets, config, base.device)
    after = measure(student, teacher, base.tokenizer, TEXTS, base.device)
    assert after.mean_cosine > before.mean_cosine
    assert 0.0 < after.sparsity < 1.0 and after.layer_sparsity.shape == (2,)
    # Gold sparsity by hand for the first text: 1 - |support| / n² per head, mean.
    from sparsefinder.data.records import extract
    from sparsefinder.metrics.scorer import Scorer

    plain = load_model(str(tiny_model_dirs["bert"]), device="cpu")
    records = extract(plain, TEXTS)
    expected = torch.stack([Scorer(r).gold_sparsity for r in records]).mean(0).mean(-1)
    got = measure(lora_student(plain.model, config), teacher, base.tokenizer, TEXTS, base.device)
    assert torch.allclose(got.layer_sparsity, expected, atol=1e-9)


def test_batches_are_a_function_of_the_step():
    assert batch_at(7, 20, 4, 0) == batch_at(7, 20, 4, 0)
    epoch = [batch_at(s, 20, 4, 0) for s in range(5)]
    assert sorted(i for b in epoch for i in b) == list(range(20))
    assert batch_at(5, 20, 4, 0) != epoch[0]


def test_bad_settings_and_uncovered_family(tiny_model_dirs):
    with pytest.raises(AdaptError, match="unknown LoRA target"):
        AdaptConfig(targets=("embeddings",))
    with pytest.raises(AdaptError, match="rank must be >= 1"):
        AdaptConfig(rank=0)
    with pytest.raises(AdaptError, match="alpha must be > 1"):
        AdaptConfig(alpha=1.0)
    gpt2 = load_model(str(tiny_model_dirs["gpt2"]), device="cpu")
    with pytest.raises(AdaptError, match="model family 'gpt2' is not covered"):
        target_modules(gpt2.model, ("attention",))


def test_target_groups_pick_the_right_layers(tiny_model_dirs):
    model = load_model(str(tiny_model_dirs["bert"]), device="cpu").model
    ffn = target_modules(model, ("ffn",))
    attention = target_modules(model, ("attention",))
    assert len(ffn) == 2 * 2 and len(attention) == 4 * 2  # 2 layers
    assert not any("attention" in name for name in ffn)  # not attention.output.dense
    assert sorted(ffn + attention) == target_modules(model, ("attention", "ffn"))
