"""A plugin of the live test servers (``tests/live_settings.py``): a streamed response
augmenter that the ``shouting`` profile turns on, so the websocket tests can see streamed
augmenters run on each delta before it is relayed; and a footer streamed after the model's
last token (the ``fake_cited`` profile, for the chat widget's browser tests)."""

from django_ragchat import hookimpl
from django_ragchat.stages.responses import ResponseAugmenter


class Shout(ResponseAugmenter):
    """Upper-cases the answer as it streams."""

    name = "shout"
    enabled_by_default = False

    def on_delta(self, text, turn):
        return text.upper()


class Footer(ResponseAugmenter):
    """Streams a Markdown footer after the answer (``finish``)."""

    name = "footer"
    enabled_by_default = False
    text = "\n\n---\n_Checked against the product sheets._"

    def finish(self, turn):
        return self.text


@hookimpl
def register_response_augmenters(register):
    register(Shout)
    register(Footer)
