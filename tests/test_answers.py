"""The answer builder (``django_ragchat.stages.answers.build_answer``): every rule, as a pure function."""

from __future__ import annotations

import copy
import logging

import pytest

from django_ragchat.stages.answers import TagStreamFilter, build_answer
from django_ragchat.types import RetrievedChunk


def chunk(n: int) -> RetrievedChunk:
    return RetrievedChunk(chunk_id=100 + n, text=f"passage {n}", score=1.0 / n, document_id=n,
                          source=f"doc{n}.md", metadata={"n": n})


DOCS = tuple(chunk(n) for n in (1, 2, 3))


def indices(built, referenced_only=True):
    return [d.index for d in built.documents if d.referenced or not referenced_only]


def test_acm_shortcut_finds_every_number_of_a_bracket():
    built = build_answer("this is an answer[1, 2]", DOCS, reference_pattern="acm")
    assert indices(built) == [1, 2]
    assert [d.document for d in built.documents] == [DOCS[0], DOCS[1]]


def test_acm_shortcut_finds_a_single_reference_and_several_brackets():
    assert indices(build_answer("a [3]. b [1]", DOCS, reference_pattern="acm")) == [1, 3]
    assert indices(build_answer("a [2,3]", DOCS, reference_pattern="acm")) == [2, 3]


@pytest.mark.parametrize("reply, expected", [
    ("A [1].", [1]),
    ("Both [1, 2].", [1, 2]),
    ("Range [1-3].", [1, 2, 3]),
    ("En dash [2–3].", [2, 3]),
    ("Nothing cited.", []),
])
def test_the_default_parser_keeps_todays_forms(reply, expected):
    assert indices(build_answer(reply, DOCS, reference_pattern="default")) == expected


def test_documents_come_back_in_prompt_order_whatever_the_order_of_references():
    built = build_answer("First [3], then [1].", DOCS, reference_pattern="default")
    assert [d.index for d in built.documents] == [1, 3]


@pytest.mark.parametrize("reply, bad", [("Zero [0].", 0), ("Too far [4].", 4), ("Far [99] and [2].", 99)])
def test_out_of_range_references_are_ignored_with_a_warning(reply, bad, caplog):
    with caplog.at_level(logging.WARNING, logger="django_ragchat.stages.answers"):
        built = build_answer(reply, DOCS, reference_pattern="default")
    assert bad not in indices(built)
    assert built.invalid_references == (bad,)
    assert any(f"[{bad}]" in w for w in built.warnings)
    assert any(f"[{bad}]" in r.getMessage() for r in caplog.records)


def test_out_of_range_with_a_custom_pattern_too():
    built = build_answer("see doc 0 and doc 2", DOCS, reference_pattern=r"doc (\d+)")
    assert indices(built) == [2] and built.invalid_references == (0,)


def test_without_a_reference_pattern_every_document_is_referenced():
    built = build_answer("No brackets at all.", DOCS)
    assert indices(built) == [1, 2, 3]
    assert all(d.referenced for d in built.documents)


def test_return_only_referenced_false_returns_all_with_the_flag():
    built = build_answer("Only [2].", DOCS, reference_pattern="default", return_only_referenced=False)
    assert [(d.index, d.referenced) for d in built.documents] == [(1, False), (2, True), (3, False)]
    assert [d.index for d in built.referenced] == [2]


def test_inputs_are_never_mutated():
    docs = [chunk(1), chunk(2)]
    before = copy.deepcopy(docs)
    built = build_answer("<answer>X [1]</answer>", docs, reference_pattern="acm",
                         extract_xml_tags=["answer"], return_only_referenced=False)
    assert docs == before and [d.metadata for d in docs] == [{"n": 1}, {"n": 2}]
    assert built.documents[0].document is docs[0]  # the same object, wrapped, not copied


def test_pattern_with_one_group_extracts_the_group():
    built = build_answer("this is an argument. Answer: this is an answer", DOCS, pattern=r"Answer: (.*)")
    assert built.text == "this is an answer"
    assert "argument" in built.discarded


def test_pattern_without_a_group_extracts_the_whole_match():
    assert build_answer("this is an argument.\nthis is an answer", DOCS, pattern=r"[^\n]+$").text == "this is an answer"


def test_pattern_that_does_not_match_gives_an_empty_answer():
    built = build_answer("no marker here", DOCS, pattern=r"Answer: (.*)", reference_pattern="default")
    assert built.text == "" and built.documents == ()


def test_pattern_with_two_groups_is_a_value_error():
    with pytest.raises(ValueError, match="2 capture groups"):
        build_answer("Answer: x", DOCS, pattern=r"(Answer): (.*)")


def test_reference_pattern_with_two_groups_or_invalid_is_a_value_error():
    with pytest.raises(ValueError, match="capture groups"):
        build_answer("x", DOCS, reference_pattern=r"(\d)(\d)")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        build_answer("x", DOCS, pattern=r"(unclosed")


def test_references_outside_the_extracted_answer_do_not_count():
    built = build_answer("Reasoning about [1] here. Answer: the price is $5 [2]", DOCS,
                         pattern=r"Answer: (.*)", reference_pattern="default")
    assert built.text == "the price is $5 [2]" and indices(built) == [2]


def test_xml_tags_extract_the_answer_and_discard_the_thinking():
    reply = "<thinking>Passage [1] is about B, [3] is old.</thinking>\n<answer>It costs $699 [2].</answer>"
    built = build_answer(reply, DOCS, reference_pattern="default", extract_xml_tags=["answer"])
    assert built.text == "It costs $699 [2]."
    assert indices(built) == [2]  # [1] and [3] were only in the discarded thinking
    assert built.tags == {"answer": ["It costs $699 [2]."]}
    assert "<thinking>Passage [1]" in built.discarded


def test_xml_tags_several_names_and_an_unclosed_tag():
    reply = "<answer>Part one [1].</answer> noise <ANSWER>Part two [3]"
    built = build_answer(reply, DOCS, reference_pattern="acm", extract_xml_tags=["answer", "summary"])
    assert built.text == "Part one [1].\n\nPart two [3]"
    assert indices(built) == [1, 3] and built.discarded == "noise"


def test_xml_tags_missing_keep_the_whole_reply_with_a_warning():
    built = build_answer("Plain answer [1].", DOCS, reference_pattern="default", extract_xml_tags=["answer"])
    assert built.text == "Plain answer [1]." and indices(built) == [1]
    assert any("none of the tags" in w for w in built.warnings)


def test_xml_tags_then_pattern():
    reply = "<answer>Draft. FINAL: yes [1]</answer>"
    built = build_answer(reply, DOCS, reference_pattern="default", extract_xml_tags=["answer"], pattern=r"FINAL: (.*)")
    assert built.text == "yes [1]" and indices(built) == [1]


@pytest.mark.parametrize("bad", ["answer", ["<answer>"], [1]])
def test_bad_tag_names_are_a_value_error(bad):
    with pytest.raises(ValueError, match="extract_xml_tags"):
        build_answer("x", DOCS, extract_xml_tags=bad)


def test_untrusted_reply_never_raises():
    for reply in ["[", "[99999999999999999999]", "[1-999999]", "<answer", "\x00", "[1,,2]", "<answer></answer>"]:
        build_answer(reply, DOCS, reference_pattern="default", extract_xml_tags=["answer"])
        build_answer(reply, DOCS, reference_pattern="acm")


def test_no_documents():
    built = build_answer("Cites [1].", (), reference_pattern="default")
    assert built.documents == () and built.invalid_references == (1,)
    assert build_answer("x", ()).documents == ()


# --- Streaming: only the tags' content streams --------------------------------------------------
REPLIES = [
    ("<thinking>secret [1]</thinking>\n<answer>It costs $699 [2].</answer>", "It costs $699 [2]."),
    ("<thinking>a < b</thinking><answer>x <b>bold</b> y</answer> trailing secret", "x <b>bold</b> y"),
    ("<Answer>one</Answer> secret <answer>two", "one\n\ntwo"),  # an unclosed tag runs to the end
    ("No tags at all < here.", "No tags at all < here."),  # the whole reply, released at the end
]


@pytest.mark.parametrize("reply, expected", REPLIES)
def test_tag_stream_filter_at_every_split_point(reply, expected):
    for cut in range(len(reply) + 1):
        for step in (1, 3):
            stream = TagStreamFilter(["answer"])
            pieces = [reply[:cut]] + [reply[i:i + step] for i in range(cut, len(reply), step)]
            sent = "".join(stream.feed(p) for p in pieces) + stream.close()
            assert sent == expected, (cut, step)
            assert "secret" not in sent
            assert stream.raw == reply and stream.emitted == sent


def test_tag_stream_filter_holds_thinking_until_the_answer_opens():
    stream = TagStreamFilter(["answer"])
    assert stream.feed("<thinking>The user wants") == ""
    assert stream.feed(" prices.</thinking><ans") == ""
    assert stream.feed("wer>It costs") == "It costs"
    assert stream.feed(" $699.</answ") == " $699."
    assert stream.feed("er>") == "" and stream.close() == ""
