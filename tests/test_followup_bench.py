"""``bench/bench_followup.py`` at a tiny size, so it cannot rot, and its labelled data is sound."""

from __future__ import annotations

import pytest

from bench import bench_followup

pytestmark = pytest.mark.django_db


def test_the_labelled_conversations_are_well_formed():
    conversations = bench_followup.load_conversations()
    assert len(conversations) >= 40
    kinds = {"start", "switch_inherit", "switch_new", "switch_back", "pronoun", "pronoun_after_switch",
             "same_subject", "fresh", "topic"}
    for conv in conversations:
        assert conv["split"] in ("tune", "heldout") and conv["corpus"] in bench_followup.CORPORA
        folder = bench_followup.CORPORA[conv["corpus"]]
        for turn in conv["turns"]:
            assert turn["kind"] in kinds and turn["expect"]
            assert (folder / f"{turn['doc']}.md").exists(), turn
    # Every third conversation of the 48 written before tuning is held out; those written after a
    # fix (catalogue-25 on) measure it and are tune.
    original = [c for c in conversations if int(c["id"].rsplit("-", 1)[1]) <= 24]
    heldout = sum(c["split"] == "heldout" for c in original)
    assert len(original) == 48 and heldout == 16
    assert all(c["split"] == "tune" for c in conversations if c not in original)


def test_the_bench_plays_every_variant_and_removes_its_documents():
    from django_ragchat.models import Document

    results = bench_followup.run(limit=1)

    first = {c: [c_ for c_ in bench_followup.load_conversations() if c_["corpus"] == c][0]
             for c in bench_followup.CORPORA}
    turns = sum(len(c["turns"]) for c in first.values())
    assert {name: len(items) for name, items in results["variants"].items()} == {
        name: turns for name in bench_followup.VARIANTS}
    # The first sample conversation is the issue's: "What about the Nimbus Tab?" after the
    # Zephyr Buds' battery life. Subject-blind, the old subject was searched; now the new one is.
    before = [o for o in results["variants"]["before"] if o.conversation == "sample-01"]
    after = [o for o in results["variants"]["after"] if o.conversation == "sample-01"]
    assert after[1].doc_ok and "battery" in after[1].searched and "Zephyr" not in after[1].searched
    assert "Zephyr" in before[1].searched and "battery" not in before[1].searched
    assert not Document.objects.exists()
    assert "inheriting the attribute" in bench_followup.report(results, "test db")
