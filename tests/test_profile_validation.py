"""Profiles are validated when they are built, with the sentences the system check prints, so a
server (which never runs ``manage.py check``) refuses a wrong profile instead of running turns."""

from __future__ import annotations

import pytest
from django.core import checks

from django_ragchat.models import Message
from django_ragchat.profiles import InvalidProfile, build_profile, get_profile, profile_title

BAD = [
    ({"history_share": 5}, "history_share must be between 0 and 1"),
    ({"top_k": 0}, "top_k must be at least 1 and retrieval_k at least top_k"),
    ({"empty_context": "shrug"}, "empty_context must be one of ('decline', 'answer'), not 'shrug'"),
    ({"top_k": "4"}, "top_k must be a whole number, not '4'"),
    ({"top_k": True}, "top_k must be a whole number, not True"),
    ({"retrievers": "vector"}, "retrievers must be a list of component names or None, not 'vector'"),
    ({"options": {"openai": "gpt"}}, "options must be a dict of component name -> dict of options"),
    ({"similarity_threshold": 3}, "similarity_threshold must be None or a number from -1 to 1, not 3"),
    ({"max_answer_tokens": 9000}, "max_answer_tokens must be at least 1 and smaller than context_window"),
    ({"stream": "yes"}, "stream must be True or False, not 'yes'"),
    ({"title": ""}, "title must be a non-empty string (what people see for the profile), not ''"),
    ({"title": ["Support"]}, "title must be a non-empty string (what people see for the profile), not ['Support']"),
]


@pytest.mark.parametrize(("config", "problem"), BAD)
def test_a_wrong_value_is_refused_when_the_profile_is_built(config, problem):
    with pytest.raises(InvalidProfile) as caught:
        build_profile("shop", config)
    assert any(p.startswith(problem) for p in caught.value.problems)
    assert f"Profile 'shop': {problem}" in str(caught.value)


@pytest.mark.parametrize(("config", "problem"), BAD)
def test_the_system_check_prints_the_same_sentence(config, problem, ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {}, "shop": config})
    errors = [e for e in checks.run_checks() if e.id == "ragchat.E002"]
    assert any(e.msg.startswith(f"Profile 'shop': {problem}") for e in errors), [e.msg for e in errors]
    with pytest.raises(InvalidProfile) as caught:
        get_profile("shop")
    assert any(e.msg == f"Profile 'shop': {p}" for p in caught.value.problems for e in errors)


def test_every_problem_is_reported_not_only_the_first():
    with pytest.raises(InvalidProfile) as caught:
        build_profile("shop", {"history_share": 5, "top_k": 0, "empty_context": "shrug"})
    assert len(caught.value.problems) == 3


def test_the_defaults_are_valid():
    assert build_profile("default", {}).top_k == 4


def test_a_profile_is_shown_by_its_title_and_by_its_name_without_one(ragchat_settings_override):
    """A new user's trial: the chat page's list and the admin showed "support", the settings'
    key. A title is what people see; the name stays the key."""
    assert build_profile("support", {"title": "Customer support"}).title == "Customer support"
    assert build_profile("support", {}).title == "support"
    ragchat_settings_override(PROFILES={"default": {}, "support": {"title": "Customer support"},
                                        "billing": {"title": "Billing", "top_k": 0}, "odd": {"title": 7}})
    shown = {name: profile_title(name) for name in ("default", "support", "billing", "odd", "gone")}
    # A profile that cannot be built keeps a title of its own; a wrong one, or none, is its name.
    assert shown == {"default": "default", "support": "Customer support", "billing": "Billing", "odd": "odd",
                     "gone": "gone"}
    errors = [e.msg for e in checks.run_checks() if e.id == "ragchat.E002"]
    assert any(m.startswith("Profile 'odd': title must be a non-empty string") for m in errors), errors
    ragchat_settings_override(PROFILES={"default": {"titel": "Help"}})
    errors = [e.msg for e in checks.run_checks() if e.id == "ragchat.E002"]
    assert any("unknown option(s) ['titel'] (did you mean 'title'?)" in m for m in errors), errors


@pytest.mark.django_db
def test_a_turn_on_a_wrong_profile_is_refused_before_anything_is_saved(ragchat_settings_override, user):
    from django_ragchat.models import Conversation
    from django_ragchat.turn.pipeline import run_turn_sync

    ragchat_settings_override(PROFILES={"default": {}, "shop": {"history_share": 5}})
    conversation = Conversation.objects.create(owner=user, profile="shop")
    from django_ragchat.exceptions import ProfileUnavailable

    with pytest.raises(ProfileUnavailable) as refused:  # 500 profile_unavailable on every transport
        run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    assert isinstance(refused.value.__cause__, InvalidProfile)  # the cause, also in the log
    assert not Message.objects.filter(conversation=conversation).exists()


# --- Every independent problem in one run (a site builder's trial: one fixed per run) ----------


def ragchat_messages(*ids: str) -> list[tuple[str, str, str]]:
    return [(e.id, e.msg, e.hint) for e in checks.run_checks() if e.id in ids]


def test_a_misspelt_options_key_is_told_the_component_it_is_close_to(ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {"options": {"folowup": {"max_terms": 2}}}})
    [(_, msg, hint)] = ragchat_messages("ragchat.W043")
    assert msg == "Profile 'default': options['folowup'] names no component of this profile, so nothing reads it."
    assert hint.startswith("Did you mean 'followup'? Its components: "), hint


def test_a_wrong_value_and_a_misspelt_options_key_are_reported_in_one_run(ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {"top_k": 0, "sistem_prompt": "x", "retrievers": ["vectr"],
                                                    "tools": ["nothing_registered"]},
                                        "shop": {"history_share": 5, "options": {"folowup": {}}}})
    found = ragchat_messages("ragchat.E002", "ragchat.W043")
    errors = sorted(msg for check_id, msg, _ in found if check_id == "ragchat.E002")
    assert len(errors) == 5, errors
    for fragment in ("'default': unknown option(s) ['sistem_prompt']", "'default': top_k must be at least 1",
                     "'default': retrievers: No retriever named 'vectr'", "'default': tools: no tool named",
                     "'shop': history_share must be between 0 and 1"):
        assert any(fragment in msg for msg in errors), (fragment, errors)
    # The warning of the profile whose components are known; none of the one that names an unknown one.
    assert [msg for check_id, msg, _ in found if check_id == "ragchat.W043"] == [
        "Profile 'shop': options['folowup'] names no component of this profile, so nothing reads it."]


def test_an_unknown_tool_and_components_that_reject_their_options_are_all_reported(ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {"tools": ["nothing_registered"], "options": {
        "followup": {"max_term": 2}, "top_k": {"k": 3}, "extractive": {"min_coverage": 2}}}})
    errors = [msg for _, msg, _ in ragchat_messages("ragchat.E002")]
    assert len(errors) == 4, errors
    for fragment in ("no tool named 'nothing_registered'", "has no option 'max_term'", "takes no options; got ['k']",
                     "min_coverage must be a number from 0 to 1"):
        assert any(fragment in msg for msg in errors), (fragment, errors)


def test_no_follow_on_warning_of_an_options_key_for_a_misspelt_component(ragchat_settings_override):
    """``retrievers: ["vectr"]`` with options for ``vector``: the E002 says it; a W043 for
    ``vector`` would only be its consequence."""
    ragchat_settings_override(PROFILES={"default": {"retrievers": ["vectr"], "options": {"vector": {"exact": True}}}})
    assert [check_id for check_id, _, _ in ragchat_messages("ragchat.E002", "ragchat.W043")] == ["ragchat.E002"]


def test_tools_offered_to_the_extractive_answerer_are_said_beside_a_wrong_value(ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {"top_k": 0, "retrieval": "tool"}})
    assert sorted(check_id for check_id, _, _ in ragchat_messages("ragchat.E002", "ragchat.W041")) == [
        "ragchat.E002", "ragchat.W041"]
