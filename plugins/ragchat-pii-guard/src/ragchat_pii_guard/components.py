"""The guardrail ``pii_guard`` and the streamed response augmenter ``pii_redact_stream``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from django_ragchat.stages.guardrails import Guardrail
from django_ragchat.stages.responses import ResponseAugmenter
from django_ragchat.types import Answer, Redaction, Refusal

from ragchat_pii_guard.detect import DEFAULT_PLACEHOLDER, KINDS, StreamRedactor, check_kinds, find_pii, redact

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

LABELS = {"card": "a payment card number", "email": "an e-mail address", "phone": "a phone number"}


def _options(component: str, profile, kinds: dict[str, Iterable[str]], placeholder: str,
             allow: Iterable[str]) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """Validated kind lists and allow list; ``ImproperlyConfigured`` (a system check error) if not."""
    try:
        checked = {option: check_kinds(value, option) for option, value in kinds.items()}
        if not isinstance(placeholder, str):
            raise ValueError(f"placeholder must be a string, not {placeholder!r}.")
        placeholder.format(kind="email")
        if isinstance(allow, str) or not all(isinstance(a, str) for a in allow):
            raise ValueError(f"allow must be a list of strings, not {allow!r}.")
    except (ValueError, KeyError, IndexError) as exc:
        raise ImproperlyConfigured(f"{component} in profile {profile.name!r}: {exc}") from None
    return checked, tuple(allow)


def _record(turn: TurnContext, component: str, key: str, counts) -> None:
    """Counts by kind in the trace, never the data itself (traces are stored)."""
    if counts:
        entry = turn.trace.setdefault(component, {}).setdefault(key, {})
        for kind, n in counts.items():
            entry[kind] = entry.get(kind, 0) + n


class PIIGuard(Guardrail):
    """Refuses input carrying personal data of some kinds; redacts the answer before it is saved.

    Options (``profile.options["pii_guard"]``):

    * ``refuse_input`` (``["card"]``): kinds whose presence in the user's message refuses the
      turn before retrieval, so the data never reaches the search or the model. The refusal
      carries the message redacted (``Refusal.redacted``), which the turn keeps instead of the
      text typed: the stored message reads "[redacted card]" where the number was.
    * ``redact_input`` (``[]``): kinds replaced in the user's message, which then goes on
      (a ``Redaction``): the search, the model and the stored message see the placeholder.
    * ``redact_output`` (``["card", "email", "phone"]``): kinds replaced in the answer.
    * ``placeholder`` (``"[redacted {kind}]"``): what replaces a finding.
    * ``allow`` (``[]``): strings never redacted nor refused, e.g. your support address.
    * ``refusal``: the answer given on refusal (default: names what was found).
    """

    name = "pii_guard"
    order = 20

    def __init__(self, profile, *, refuse_input: Iterable[str] = ("card",), redact_input: Iterable[str] = (),
                 redact_output: Iterable[str] = KINDS, placeholder: str = DEFAULT_PLACEHOLDER,
                 allow: Iterable[str] = (), refusal: str | None = None, **options: Any):
        super().__init__(profile, **options)
        kinds, self.allow = _options(self.name, profile, {"refuse_input": refuse_input, "redact_input": redact_input,
                                                          "redact_output": redact_output}, placeholder, allow)
        self.refuse_input = kinds["refuse_input"]
        self.redact_input = kinds["redact_input"]
        self.redact_output = kinds["redact_output"]
        self.placeholder = placeholder
        self.refusal = refusal

    def refusal_text(self, kinds: list[str]) -> str:
        if self.refusal is not None:
            return self.refusal
        found = " and ".join(LABELS[k] for k in kinds)
        return (f"Your message seems to contain {found}. For your safety I don't process that here: "
                f"please remove it and ask again.")

    def check_input(self, text: str, turn: TurnContext) -> Refusal | Redaction | None:
        findings = find_pii(text, self.refuse_input, allow=self.allow)
        if findings:
            kinds = [k for k in KINDS if any(f.kind == k for f in findings)]
            _record(turn, self.name, "input_refused", {k: 1 for k in kinds})
            # What was refused is kept without it (nor what redact_input would have taken out).
            kept, _ = redact(text, {*self.refuse_input, *self.redact_input}, placeholder=self.placeholder,
                             allow=self.allow)
            return Refusal(self.refusal_text(kinds), reason=f"input contains {', '.join(kinds)}", redacted=kept)
        if self.redact_input:
            kept, counts = redact(text, self.redact_input, placeholder=self.placeholder, allow=self.allow)
            if counts:
                _record(turn, self.name, "input_redacted", counts)
                return Redaction(kept, reason=f"input contained {', '.join(k for k in KINDS if k in counts)}")
        return None

    def check_output(self, answer: Answer, turn: TurnContext) -> Answer | None:
        text, counts = redact(answer.text, self.redact_output, placeholder=self.placeholder, allow=self.allow)
        if not counts:
            return None
        _record(turn, self.name, "output_redacted", counts)
        return answer.replace(text=text)


class PIIRedactStream(ResponseAugmenter):
    """Redacts personal data in a streamed answer as it streams, without ever sending part of it.

    ``on_delta`` holds back only a short tail that more text could turn into a match (see
    ``StreamRedactor``) and sends the rest at once; ``on_complete`` sends the held tail, so the
    saved answer is complete. Each turn's buffer lives in ``turn.state["pii_redact_stream"]``
    (component instances are shared by all turns of a profile). Whole answers go through
    ``augment``. Order 50: before ``citations`` (100), which must see the flushed tail.

    Options (``profile.options["pii_redact_stream"]``): ``kinds`` (all three), ``placeholder``,
    ``allow``, as for ``pii_guard``.
    """

    name = "pii_redact_stream"
    order = 50

    def __init__(self, profile, *, kinds: Iterable[str] = KINDS, placeholder: str = DEFAULT_PLACEHOLDER,
                 allow: Iterable[str] = (), **options: Any):
        super().__init__(profile, **options)
        checked, self.allow = _options(self.name, profile, {"kinds": kinds}, placeholder, allow)
        self.kinds = checked["kinds"]
        self.placeholder = placeholder

    def _redactor(self, turn: TurnContext) -> StreamRedactor:
        redactor = turn.state.get(self.name)
        if redactor is None:
            redactor = turn.state[self.name] = StreamRedactor(self.kinds, placeholder=self.placeholder, allow=self.allow)
        return redactor

    def on_delta(self, text: str, turn: TurnContext) -> str:
        return self._redactor(turn).feed(text)

    def finish(self, turn: TurnContext) -> str:
        # The held tail streams after the model's last piece, before any later augmenter's tail
        # (a sources line) and through the later augmenters' on_delta.
        return self._redactor(turn).flush()

    def on_complete(self, answer: Answer, turn: TurnContext) -> Answer:
        redactor = self._redactor(turn)
        text = answer.text + redactor.flush()
        _record(turn, self.name, "redacted", redactor.counts)
        del turn.state[self.name]
        # A safety net: the streamed pieces are redacted already, unless another augmenter's
        # on_delta put personal data back in.
        return self.augment(answer.replace(text=text), turn)

    def augment(self, answer: Answer, turn: TurnContext) -> Answer:
        text, counts = redact(answer.text, self.kinds, placeholder=self.placeholder, allow=self.allow)
        _record(turn, self.name, "redacted", counts)
        return answer.replace(text=text) if counts else answer
