"""Coreference page through AppTest: probe choice, head ranking, pronoun rows, k-means recall."""

from __future__ import annotations

from apptest_helpers import assert_clean, figures, metric, new_app


def _open(**params):
    at = new_app(**params).run()
    at.switch_page("app_pages/coreference.py").run()
    assert_clean(at)
    return at


def _ranking(at):
    return at.dataframe[0].value  # the ranking is the first table of the page


def test_coreference_page_renders_and_follows_the_probe(with_projections):
    at = _open(B="4")
    assert not at.error
    assert len(figures(at)) == 2  # pronoun rows, paper reference beside ours
    assert any(m.label == "Paper recall" for m in at.metric)
    first = _ranking(at)
    recall = metric(at, "Head sparsity (p01)")
    assert 0.0 <= recall <= 1.0
    options = at.selectbox(key="w_probe").options
    at.selectbox(key="w_probe").set_value(options[1]).run()
    assert_clean(at)
    second = _ranking(at)
    assert not first.equals(second)
    assert not any("(p01)" in m.label for m in at.metric)
    at.select_slider(key="w_coref_B").set_value(2).run()
    assert_clean(at)
    assert at.query_params.get("B") != "2"  # the page's own B, not the Explorer's


def test_opens_on_the_demo_setting_and_keeps_the_explorers_alone(with_projections):
    at = _open(B="4", k="1")
    assert at.select_slider(key="w_coref_B").value == 8  # the demo's B
    assert at.slider(key="w_coref_k").value == 2
    assert at.query_params["B"] == "4" and at.query_params["k"] == "1"


def test_coreference_on_the_text_in_the_sidebar(with_projections):
    at = new_app(method="window").run()
    at.radio(key="w_source").set_value("paste").run()
    text = "The pilots thanked the mechanic because he had fixed their engine overnight."
    at.text_area(key="w_paste").input(text).run()
    at.switch_page("app_pages/coreference.py").run()
    at.radio(key="w_coref_source").set_value("own").run()
    assert_clean(at)
    chosen = at.multiselect(key="w_coref_pairs").value
    assert chosen == ["he → mechanic", "their → pilots"]  # words, not character offsets
    ranking = _ranking(at)
    assert ranking["n_pairs"].iloc[0] == len(chosen)
    assert 0.0 <= metric(at, "Head sparsity (your text)") <= 1.0
    at.multiselect(key="w_coref_pairs").set_value([]).run()
    assert any("No pair chosen" in i.value for i in at.info)
    at.selectbox(key="w_coref_pronoun").set_value(6).run()  # "he"
    at.selectbox(key="w_coref_antecedent").set_value(1).run()  # "pilots"
    at.button(key="w_coref_add").click().run()
    assert_clean(at)
    assert _ranking(at)["n_pairs"].iloc[0] == 1


def test_ranking_over_all_probes(with_projections):
    at = _open(B="4")
    at.radio(key="w_coref_scope").set_value("all").run()
    assert_clean(at)
    ranking = _ranking(at)
    assert ranking["n_pairs"].iloc[0] > 40
    assert 0.0 <= metric(at, "Head sparsity (all probes)") <= 1.0


def test_missing_projections_is_an_info_not_an_exception(without_projections):
    at = _open()
    assert any("needs learned projections" in i.value for i in at.info)
    assert len(figures(at)) == 1  # the gold pronoun rows are still drawn
    assert len(_ranking(at)) == 10


def test_the_best_guess_of_every_pronoun_is_chosen_and_a_second_can_be_added(with_projections):
    """The page opens with ONE guess per pronoun (the nearest agreeing noun), for every
    pronoun the guesses name; the other candidates are offered. Choosing two antecedents for
    one pronoun once crashed the pronoun figure (a reshape into one row per pair): each
    pronoun token is one row, with all its candidates outlined."""
    for example in ("short_dialogue", "coreference_story"):
        at = new_app(method="window", example=example).run()
        at.switch_page("app_pages/coreference.py").run()
        at.radio(key="w_coref_source").set_value("own").run()
        assert_clean(at)
        chips = at.multiselect(key="w_coref_pairs")
        chosen = chips.value
        pronouns = [label.split(" → ")[0] for label in chosen]
        assert len(set(pronouns)) == len(pronouns) > 6  # one each, all of them
        assert {o.split(" → ")[0] for o in chips.options} == set(pronouns)
        assert len(chips.options) > len(chosen)  # the second candidates are offered
        assert all("@" not in label for label in chips.options)
        chips.set_value(list(chips.options)).run()  # every candidate of every pronoun
        assert_clean(at)
        chosen = at.multiselect(key="w_coref_pairs").value
        pronouns = [label.split(" → ")[0] for label in chosen]
        assert len(set(pronouns)) < len(pronouns)
        rows = figures(at)[0]
        assert len(rows["data"][0]["y"]) == len(set(pronouns))  # one-piece pronouns here
        outlined = len(rows["data"][2]["x"])
        assert outlined >= len(chosen)  # every chosen antecedent (all its pieces) outlined


COREF = "app_pages/coreference.py"
PAGE_KEYS = {"coref", "probe", "pairs", "coref_B", "coref_k", "coref_rank"}
HAND = "he (1st) → Priya (added by you)"  # short_dialogue's word 85 "he" → word 10 "Priya"


def test_text_choice_and_pairs_survive_a_page_switch_and_are_in_the_link(with_projections):
    at = new_app(method="window").run()  # the default example, short_dialogue
    at.switch_page(COREF).run()
    assert not PAGE_KEYS & set(at.query_params)  # the page's defaults stay out of the link
    layer, head = at.selectbox(key="w_coref_head").value  # but the head shown is in it
    assert at.query_params["coref_head"] == f"L{layer}H{head}"
    at.radio(key="w_coref_source").set_value("own").run()
    chips = at.multiselect(key="w_coref_pairs")
    assert not any("added by you" in o for o in chips.options)
    kept = [chips.value[0], *chips.value[2:]]  # remove the second chip
    chips.set_value(kept).run()
    at.selectbox(key="w_coref_pronoun").set_value(85).run()
    at.selectbox(key="w_coref_antecedent").set_value(10).run()
    at.button(key="w_coref_add").click().run()
    assert_clean(at)
    chosen = at.multiselect(key="w_coref_pairs").value
    assert chosen == [*kept, HAND]  # the hand pair is a chip like the guesses
    assert at.query_params["coref"] == "own"
    assert at.query_params["pairs"] == "14-10,85-62,105-74,108-62,112-101,120-101,122-62,85-10"
    at.switch_page("app_pages/explorer.py").run()
    at.switch_page(COREF).run()
    assert_clean(at)
    assert at.radio(key="w_coref_source").value == "own"
    assert at.multiselect(key="w_coref_pairs").value == chosen
    assert _ranking(at)["n_pairs"].iloc[0] == len(chosen)
    at.multiselect(key="w_coref_pairs").set_value(kept).run()  # remove the hand pair's chip
    assert HAND not in at.multiselect(key="w_coref_pairs").options


def test_a_link_with_pairs_b_and_k_reproduces_the_view(with_projections):
    at = new_app(method="window", coref="own", pairs="85-10,14-10", coref_B="4",
                 coref_k="1").run()
    at.switch_page(COREF).run()
    assert_clean(at)
    assert at.radio(key="w_coref_source").value == "own"
    assert at.multiselect(key="w_coref_pairs").value == [HAND, "her → Priya"]
    assert at.select_slider(key="w_coref_B").value == 4
    assert at.slider(key="w_coref_k").value == 1
    assert _ranking(at)["n_pairs"].iloc[0] == 2
    assert not any("This link had" in w.value for w in at.warning)
    assert {k: at.query_params[k] for k in PAGE_KEYS - {"probe", "coref_rank"}} == {
        "coref": "own", "pairs": "85-10,14-10", "coref_B": "4", "coref_k": "1"}
    at.select_slider(key="w_coref_B").set_value(8).run()  # back to the page's default B
    assert "coref_B" not in at.query_params and at.query_params["coref_k"] == "1"
    linked = new_app(probe="p03").run()
    linked.switch_page(COREF).run()
    assert linked.selectbox(key="w_probe").value == "p03"


def test_a_bad_link_gives_one_warning_listing_every_fix(with_projections):
    at = new_app(method="window", coref="mine", probe="p999", pairs="999-1,14-10",
                 coref_B="5", coref_k="0", coref_rank="every", coref_head="L9H0").run()
    at.switch_page(COREF).run()
    assert_clean(at)
    warnings = [w.value for w in at.warning if "This link had" in w.value]
    assert len(warnings) == 1, [w.value for w in at.warning]
    lines = [line for line in warnings[0].splitlines() if line.startswith("- ")]
    assert len(lines) == 7, lines
    for part in ("coref='mine'", "coref_k='0'", "probe='p999'", "pairs 999-1",
                 "coref_B=5", "coref_rank='every'", "coref_head=L9H0 is not a head"):
        assert any(part in line for line in lines), part
    assert at.selectbox(key="w_probe").value == "p01"
    assert at.select_slider(key="w_coref_B").value == 8  # the demo setting
    assert at.query_params["pairs"] == "14-10"  # the pair in range is kept
    at.selectbox(key="w_probe").set_value("p02").run()  # the user changes something
    assert not any("This link had" in w.value for w in at.warning)


def _head(at) -> tuple[int, int]:
    return tuple(at.selectbox(key="w_coref_head").value)


def _top(at, n: int = 5) -> list[tuple[int, int]]:
    """The (layer, head) of the ranking's first ``n`` rows: the head menu's options."""
    return [(int(r.layer), int(r.head)) for r in _ranking(at).head(n).itertuples()]


def test_a_link_opens_on_the_head_and_the_ranking_it_was_taken_from(with_projections):
    """The shown head, and what the heads were ranked on, travel in the link: a link taken
    from the ranking over all probes with the second head picked opens on that head, with
    the same numbers (it once opened on this probe's ranking and its best head)."""
    at = _open(B="4")
    at.radio(key="w_coref_scope").set_value("all").run()
    second = _top(at)[1]
    at.selectbox(key="w_coref_head").set_value(second).run()
    assert_clean(at)
    shown = _head(at)
    assert shown == second
    link = {k: at.query_params[k] for k in at.query_params}
    assert link["coref_rank"] == "all" and link["coref_head"] == f"L{shown[0]}H{shown[1]}"
    labels = ("Pronoun-edge recall (p01)", "Pronoun-edge recall (all probes)",
              "Head sparsity (all probes)")
    before = [metric(at, label) for label in labels]
    opened = new_app(**link).run()
    opened.switch_page(COREF).run()
    assert_clean(opened)
    assert _head(opened) == shown and opened.radio(key="w_coref_scope").value == "all"
    assert [metric(opened, label) for label in labels] == before
    assert not any("This link had" in w.value for w in opened.warning)


def test_the_own_text_view_opens_on_its_own_best_head(with_projections):
    """A head picked on the probes is not carried over to the sidebar's text (nor to another
    probe): the view opens on the best head of its own ranking."""
    at = new_app(method="window").run()
    at.switch_page(COREF).run()
    at.radio(key="w_coref_source").set_value("own").run()
    own = _top(at)  # the own text's top 5, best first
    at.radio(key="w_coref_source").set_value("probes").run()
    for probe in at.selectbox(key="w_probe").options:  # a probe whose top 5 shares a head
        at.selectbox(key="w_probe").set_value(probe).run()
        shared = [h for h in _top(at) if h in own[1:]]
        if shared:
            break
    assert shared, "no probe's top 5 shares a head with the text's (the check needs one)"
    at.selectbox(key="w_coref_head").set_value(shared[0]).run()
    assert _head(at) == shared[0]
    at.radio(key="w_coref_source").set_value("own").run()
    assert_clean(at)
    assert _head(at) == own[0] != shared[0]
    assert at.query_params["coref_head"] == f"L{own[0][0]}H{own[0][1]}"


GERMAN = ("Die Ingenieurin prüfte den Motor, weil sie wusste, dass er seit Tagen kaputt war. "
          "Die Piloten dankten ihr und flogen am Abend nach Hause.")


def test_a_text_in_another_language_shows_the_text_and_the_way_on(with_projections):
    """No automatic guesses for a German text: the page says they read English only, still
    shows the text, opens "Name a pair by hand", and ranks the heads on a pair named there."""
    at = new_app(method="window").run()
    at.radio(key="w_source").set_value("paste").run()
    at.text_area(key="w_paste").input(GERMAN).run()
    at.switch_page(COREF).run()
    at.radio(key="w_coref_source").set_value("own").run()
    assert_clean(at)
    infos = " ".join(i.value for i in at.info)
    assert "English only" in infos and "does not look English" in infos
    assert "Name a pair by hand" in infos
    assert any("Ingenieurin" in m.value for m in at.markdown)  # the text is shown
    assert not at.multiselect  # no empty list of guesses to pick from
    words = at.selectbox(key="w_coref_pronoun").options
    assert all("@" not in w for w in words)
    sie = next(i for i, w in enumerate(words) if w.endswith("· sie"))
    motor = next(i for i, w in enumerate(words) if w.endswith("· Ingenieurin"))
    at.selectbox(key="w_coref_pronoun").set_value(sie).run()
    at.selectbox(key="w_coref_antecedent").set_value(motor).run()
    at.button(key="w_coref_add").click().run()
    assert_clean(at)
    assert at.multiselect(key="w_coref_pairs").value == [
        "sie → Ingenieurin (added by you)"]
    assert _ranking(at)["n_pairs"].iloc[0] == 1
    assert len(figures(at)) == 2  # pronoun rows and the paper reference
