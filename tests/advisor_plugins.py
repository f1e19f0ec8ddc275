"""Plugins for tests/test_advisors.py: advisors, a streamed footer, reprompting guardrails and
a pluggy wrapper on a lifecycle hook. Each is loaded only by the tests that list it in
``RAGCHAT["PLUGINS"]``, and each component is off unless the test's profile names it."""

from __future__ import annotations

from django_ragchat import hookimpl
from django_ragchat.responses import ResponseAugmenter


class Footer(ResponseAugmenter):
    """Streams a sources line after the model's last piece."""

    name = "footer"
    enabled_by_default = False

    def on_delta(self, text, turn):
        turn.state.setdefault("footer_saw", []).append(text)
        return text

    async def finish(self, turn):
        return "\n\n(Sources: test)"


class Bracket(ResponseAugmenter):
    """Runs after ``footer``: wraps every piece it is given, the footer's tail included."""

    name = "bracket"
    order = 200
    enabled_by_default = False

    def on_delta(self, text, turn):
        return f"<{text}>"

    def finish(self, turn):
        return "~end~"


class Streamed:
    @hookimpl
    def register_response_augmenters(self, register):
        register(Footer)
        register(Bracket)


streamed = Streamed()
