"""ragchat-pii-guard: a django-ragchat plugin that keeps personal data out of chats.

It registers two components, both enabled by default:

* the guardrail ``pii_guard`` (``PIIGuard``): refuses a message carrying a payment card number
  (Luhn-checked), which is kept with the number redacted, and redacts e-mail addresses, phone
  numbers and card numbers in the answer before it is saved;
* the response augmenter ``pii_redact_stream`` (``PIIRedactStream``): redacts the same in a
  streamed answer as it streams, never sending part of a number or address.

Installing the distribution registers them (entry point group ``django_ragchat``); listing
``"ragchat_pii_guard"`` in ``RAGCHAT["PLUGINS"]`` does the same without entry points. The
detection itself (``find_pii``, ``redact``, ``StreamRedactor``) needs no Django.
"""

from django_ragchat import hookimpl

from ragchat_pii_guard.components import PIIGuard, PIIRedactStream
from ragchat_pii_guard.detect import KINDS, Finding, StreamRedactor, find_pii, luhn_valid, redact

__all__ = ["KINDS", "Finding", "PIIGuard", "PIIRedactStream", "StreamRedactor", "find_pii", "luhn_valid", "redact"]
__version__ = "0.1.0"


@hookimpl
def register_guardrails(register):
    register(PIIGuard)


@hookimpl
def register_response_augmenters(register):
    register(PIIRedactStream)
