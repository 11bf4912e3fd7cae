"""sparsefinder.models.recipes: every layer's α, from the user, the config or the family."""

from __future__ import annotations

import pytest
from transformers import BertConfig, BertModel, ModernBertConfig, ModernBertModel

from sparsefinder.models.recipes import (
    AlphaError,
    config_alpha,
    config_recipe,
    parse_alpha_layers,
    resolve_alphas,
    summary_alpha,
)


def _modernbert(**keys: object) -> ModernBertModel:
    config = ModernBertConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                              num_hidden_layers=6, num_attention_heads=2, local_attention=16,
                              global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2, cls_token_id=1, sep_token_id=2)
    for key, value in keys.items():
        setattr(config, key, value)
    return ModernBertModel(config)


def test_parse_alpha_layers_reads_numbers_and_names_bad_input():
    assert parse_alpha_layers("1, 1.5,2") == (1.0, 1.5, 2.0)
    with pytest.raises(AlphaError, match=r"comma-separated numbers.*'1,x'"):
        parse_alpha_layers("1,x")


def test_config_alpha_reads_the_training_codes_keys_in_order():
    assert config_alpha(BertConfig()) is None
    assert config_alpha(BertConfig(initial_alpha=2.0, alpha=1.5)) == (2.0, "initial_alpha")
    assert config_alpha(BertConfig(entmax_alpha=1.25)) == (1.25, "entmax_alpha")
    with pytest.raises(AlphaError, match=r"initial_alpha=0.5.*--alpha"):
        config_alpha(BertConfig(initial_alpha=0.5))


def test_family_recipes_and_a_named_one():
    assert config_recipe(ModernBertConfig()) == "global-only"
    assert config_recipe(BertConfig()) == "uniform"
    assert config_recipe(BertConfig(entmax_recipe="global-only")) == "global-only"
    with pytest.raises(AlphaError, match=r"'nope'.*known recipes.*--alpha-layers"):
        config_recipe(BertConfig(entmax_recipe="nope"))


def test_modernbert_recipe_keeps_softmax_on_every_local_layer():
    plans, recipe, source = resolve_alphas(_modernbert(initial_alpha=2.0), 6)
    assert recipe == "global-only" and source == "config initial_alpha"
    assert [p.alpha for p in plans] == [2.0, 1.0, 1.0, 2.0, 1.0, 1.0]
    assert [p.window for p in plans] == [None, 9, 9, None, 9, 9]  # local_attention/2 + 1
    assert plans[1].describe(causal=False) == "local ±8, softmax"
    assert plans[0].describe(causal=False) == "global, entmax α=2"
    assert summary_alpha(plans) == 2.0
    user, _, source = resolve_alphas(_modernbert(initial_alpha=2.0), 6, alpha=1.5)
    assert [p.alpha for p in user] == [1.5, 1.0, 1.0, 1.5, 1.0, 1.0] and source == "--alpha"


def test_uniform_recipe_and_default_alpha():
    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=32))
    plans, recipe, source = resolve_alphas(model, 2)
    assert [p.alpha for p in plans] == [1.5, 1.5] and (recipe, source) == ("uniform", "default")
    assert not any(p.local for p in plans)


def test_alpha_layers_are_checked_for_length_and_range():
    model = _modernbert()
    with pytest.raises(AlphaError, match=r"has 2 values but the model has 6 layers.*1.5,1.5"):
        resolve_alphas(model, 6, alpha_layers=[1.5, 1.5])
    with pytest.raises(AlphaError, match=r"layer 1: alpha must be >= 1"):
        resolve_alphas(model, 6, alpha_layers=[1.5, 0.9, 1, 1, 1, 1])
    plans, recipe, source = resolve_alphas(model, 6, alpha_layers=[1.5] * 6)
    assert [p.alpha for p in plans] == [1.5] * 6 and recipe == "per-layer"
