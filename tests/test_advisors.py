"""Around-advice and the other pipeline extension points: advisors (``around_turn``,
``around_llm``, ``around_llm_stream``), streamed tails of response augmenters, pluggy wrappers
on lifecycle hooks, and output guardrails that reprompt the model."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from django_ragchat.events import Delta
from django_ragchat.models import Conversation
from django_ragchat.pipeline import stream_turn

pytestmark = pytest.mark.django_db

QUESTION = "How much does the Aurora X2 cost?"


def collect(conversation, text, **kwargs):
    async def run():
        return [event async for event in stream_turn(conversation, text, **kwargs)]

    return async_to_sync(run)()


def test_a_streamed_augmenter_tail_is_sent_as_deltas_after_the_last_token(
    ragchat_settings_override, product_corpus, user
):
    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.streamed"],
                              PROFILES={"default": {"response_augmenters": ["citations", "footer", "bracket"]}})
    conversation = Conversation.objects.create(owner=user)
    events = collect(conversation, QUESTION, stream=True)
    deltas = [e.text for e in events if isinstance(e, Delta)]
    done = events[-1].to_dict()["message"]
    # footer's tail passed through bracket (after it in order); bracket's own tail comes last.
    assert deltas[-2:] == ["<\n\n(Sources: test)>", "~end~"]
    assert all(d.startswith("<") and d.endswith(">") for d in deltas[:-1])
    assert "".join(deltas) == done["content"]
    assert "$699" in done["content"] and done["citations"]
