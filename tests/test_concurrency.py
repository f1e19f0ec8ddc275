"""Concurrent writers: sequence numbers stay unique and ordered, and nothing is lost."""

from __future__ import annotations

import threading

import pytest
from django.db import close_old_connections

from django_ragchat.models import Conversation, Message
from django_ragchat.turn.persistence import TurnInProgress
from django_ragchat.turn.pipeline import run_turn_sync

pytestmark = pytest.mark.django_db(transaction=True)


def run_in_threads(target, arguments):
    results, barrier = [None] * len(arguments), threading.Barrier(len(arguments))

    def worker(i, args):
        try:
            barrier.wait()
            results[i] = target(*args)
        except Exception as exc:  # collected and asserted on by the test
            results[i] = exc
        finally:
            close_old_connections()

    threads = [threading.Thread(target=worker, args=(i, a)) for i, a in enumerate(arguments)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_twenty_concurrent_turns_in_twenty_conversations(product_corpus, user):
    conversations = [Conversation.objects.create(owner=user) for _ in range(20)]
    results = run_in_threads(lambda c: run_turn_sync(c, "How much does the Aurora X2 cost?"),
                             [(c,) for c in conversations])
    assert all(not isinstance(r, Exception) for r in results), results
    assert all(r.status == "complete" for r in results)
    for conversation in conversations:
        assert list(conversation.messages.values_list("seq", "role")) == [(1, "user"), (2, "assistant")]


def test_racing_sends_to_one_conversation_are_refused_not_interleaved(product_corpus, user):
    conversation = Conversation.objects.create(owner=user)
    results = run_in_threads(lambda i: run_turn_sync(conversation, f"Question {i} about the Aurora X2 price"),
                             [(i,) for i in range(5)])
    answered = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, TurnInProgress)]
    assert len(answered) + len(refused) == 5, results
    assert answered  # at least one got through
    seqs = list(Message.objects.filter(conversation=conversation).order_by("seq").values_list("seq", "role"))
    # Every answered turn is a user message directly followed by its answer; nothing else.
    assert seqs == [(s, role) for i in range(len(answered)) for s, role in ((2 * i + 1, "user"), (2 * i + 2, "assistant"))]
