"""``manage.py ragchat_chat``: chat with a profile in the terminal.

Interactive by default (``you> `` prompt, answers streamed word by word, then the numbered
sources); ``--message TEXT`` answers one message; ``--json`` prints one JSON object for scripts.
Tool calls are shown as they happen (``[Looking up order ORD-17…]``); one that needs approval
asks ``Allow? [y/N]`` (anything but y rejects it).
Turns run through ``django_ragchat.turn.pipeline`` exactly as they do on the site, so what you see
here (and in ``--json``'s trace) is what a visitor gets.

The command line is a trusted, staff-level context: conversations it creates have no owner
unless ``--user`` is given, and ``--conversation`` opens any conversation (or, with ``--user``,
any conversation that user may access).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import threading
import uuid

from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_ragchat.events import Completed, Delta, Failed, Retry, ToolCallFinished, ToolCallUpdate
from django_ragchat.exceptions import InvalidMessage, TurnInProgress
from django_ragchat.models import Conversation
from django_ragchat.permissions import get_conversation_for
from django_ragchat.profiles import get_profile
from django_ragchat.turn.confirmations import DecisionRefused, record_decision
from django_ragchat.turn.pipeline import run_turn_sync, stream_turn, validate_user_message

QUIT_COMMANDS = {"/quit", "/exit"}
TITLE_CHARS = 80


class Command(BaseCommand):
    help = "Chat with an assistant profile in the terminal (interactive, or one message with --message)."
    # call_command(..., stdin=...) feeds the interactive loop in tests.
    stealth_options = ("stdin",)

    def add_arguments(self, parser):
        parser.add_argument("--profile", help="The profile of a new conversation (default: the default profile).")
        parser.add_argument("--conversation", metavar="ID", help="Continue this conversation.")
        parser.add_argument("--message", metavar="TEXT", help="Send one message, print the answer and exit.")
        parser.add_argument("--json", action="store_true",
                            help="With --message: print one JSON object (answer, sources, citations, trace).")
        parser.add_argument("--user", metavar="USERNAME",
                            help="Chat as this user: new conversations are theirs; --conversation must be one "
                                 "they may access.")

    def handle(self, *args, **options):
        self.stdin = options.get("stdin") or sys.stdin
        if options["json"] and options["message"] is None:
            raise CommandError("--json prints one answer: give the message with --message TEXT.")
        try:
            profile = get_profile(options["profile"])
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        self.user = self._user(options["user"])
        self.profile_name = profile.name
        self.conversation = None
        if options["conversation"]:
            self.conversation = self._existing_conversation(options["conversation"])
            if options["profile"] and self.conversation.profile != profile.name:
                raise CommandError(f"Conversation {self.conversation.pk} uses profile "
                                   f"{self.conversation.profile!r}, not {profile.name!r}.")

        if options["message"] is None:
            self.interactive()
            return
        text = self._validated(options["message"])
        if options["json"]:
            self.one_shot_json(text)
        else:
            ok = self.answer(text)
            self.stderr.write(f"conversation: {self.conversation.pk}")
            if not ok:
                raise CommandError("The turn did not complete.")

    # --- Setup ---------------------------------------------------------------------------------

    def _user(self, username):
        if username is None:
            return None
        User = get_user_model()
        try:
            return User._default_manager.get_by_natural_key(username)
        except User.DoesNotExist:
            raise CommandError(f"No user {username!r}.") from None

    def _existing_conversation(self, conversation_id: str) -> Conversation:
        try:
            uuid.UUID(conversation_id)
        except ValueError:
            raise CommandError(f"{conversation_id!r} is not a conversation id (a UUID).") from None
        if self.user is not None:
            try:
                return get_conversation_for(self.user, conversation_id)
            except Conversation.DoesNotExist:
                raise CommandError(f"No conversation {conversation_id} that user {self.user} may open.") from None
        conversation = Conversation.objects.filter(pk=conversation_id).first()
        if conversation is None:
            raise CommandError(f"No conversation {conversation_id}.")
        return conversation

    def _validated(self, text: str) -> str:
        try:
            return validate_user_message(text)
        except InvalidMessage as exc:
            raise CommandError(exc.message) from None

    def _ensure_conversation(self, first_message: str) -> Conversation:
        """The conversation, created on the first valid message (so bad input leaves none behind)."""
        if self.conversation is None:
            self.conversation = Conversation.objects.create(
                owner=self.user, profile=self.profile_name, title=" ".join(first_message.split())[:TITLE_CHARS],
            )
        return self.conversation

    # --- One shot, JSON ------------------------------------------------------------------------

    def one_shot_json(self, text: str) -> None:
        conversation = self._ensure_conversation(text)
        try:
            result = run_turn_sync(conversation, text)
        except TurnInProgress as exc:
            raise CommandError(str(exc)) from None
        message = result.message
        self.stdout.write(json.dumps({
            "conversation_id": result.conversation_id,
            "answer": message["content"],
            "status": message["status"],
            "citations": message["citations"],
            "sources": message["sources"],
            "trace": result.trace,
            "error": {"code": result.error.code, "message": result.error.message} if result.error else None,
        }, indent=2, ensure_ascii=False))
        if result.error is not None:
            raise CommandError(f"The turn failed: {result.error.message}")

    # --- Streaming -----------------------------------------------------------------------------

    def answer(self, text: str) -> bool:
        """Stream the answer to ``text`` and print its sources; True if the turn completed.

        Ctrl-C while the answer is written cancels the turn: the pipeline saves the partial
        answer as "incomplete", and the conversation goes on.
        """
        conversation = self._ensure_conversation(text)
        state: dict = {}

        def on_interrupt(signum, frame):
            state["interrupted"] = True
            loop, task = state.get("loop"), state.get("task")
            if loop is not None and task is not None:
                loop.call_soon_threadsafe(task.cancel)

        # The turn's event loop runs in another thread (async_to_sync), so the signal is turned
        # into a cancellation of its task rather than a KeyboardInterrupt in this one.
        restore = None
        if threading.current_thread() is threading.main_thread():
            restore = signal.signal(signal.SIGINT, on_interrupt)
        try:
            outcome = async_to_sync(self._run_turn)(conversation, text, state)
        except TurnInProgress as exc:
            raise CommandError(str(exc)) from None
        finally:
            if restore is not None:
                signal.signal(signal.SIGINT, restore)

        if outcome == "cancelled":
            self.stdout.write("")
            self.stdout.write("[stopped: the partial answer was saved as incomplete]")
            return False
        final = state.get("final")
        self.stdout.write("")
        if isinstance(final, Failed):
            self.stderr.write(f"error ({final.code}): {final.message}")
            return False
        self._print_sources(final.message)
        return True

    async def _run_turn(self, conversation: Conversation, text: str, state: dict) -> str:
        state["loop"] = asyncio.get_running_loop()
        task = state["task"] = asyncio.ensure_future(self._consume(conversation, text, state))
        if state.get("interrupted"):  # Ctrl-C before the task existed
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # this coroutine itself was cancelled, not the turn
            return "cancelled"
        return "finished"

    async def _consume(self, conversation: Conversation, text: str, state: dict) -> None:
        async with contextlib.aclosing(stream_turn(conversation, text)) as events:
            async for event in events:
                if isinstance(event, Delta):
                    self.stdout.write(event.text, ending="")
                    self.stdout.flush()
                elif isinstance(event, Retry):
                    # A terminal cannot take back what it printed: say the next text replaces it.
                    self.stdout.write(f"\n[answer rejected by {event.guardrail}; answering again]\n")
                elif isinstance(event, ToolCallUpdate):
                    await self._tool_call(event)
                elif isinstance(event, ToolCallFinished):
                    outcome = event.status if event.error is None else f"{event.status}: {event.error['message']}"
                    self.stdout.write(f"[{event.name}: {outcome}]")
                elif isinstance(event, (Completed, Failed)):
                    state["final"] = event

    async def _tool_call(self, event: ToolCallUpdate) -> None:
        """Show a tool call; ask for the approval it needs (the terminal is a trusted context)."""
        if event.status == "requested":
            self.stdout.write(f"\n[{event.label}]")
        elif event.status == "awaiting_confirmation":
            arguments = json.dumps(event.arguments, ensure_ascii=False)
            self.stdout.write(f"[{event.label.rstrip('…')} needs your approval: {event.name}({arguments})] "
                              f"Allow? [y/N] ", ending="")
            self.stdout.flush()
            line = await asyncio.to_thread(self.stdin.readline)  # the turn's calls go on meanwhile
            try:
                await sync_to_async(record_decision)(event.confirmation_id, self.user, line.strip().lower() == "y")
            except DecisionRefused as exc:
                self.stderr.write(exc.message)

    def _print_sources(self, message: dict) -> None:
        if not message["sources"]:
            return
        cited = {c["index"] for c in message["citations"]}
        self.stdout.write("Sources:")
        for source in message["sources"]:
            label = source["source"] + (f" — {source['heading']}" if source["heading"] else "")
            mark = " (cited)" if source["index"] in cited else ""
            self.stdout.write(f"  [{source['index']}] {label}{mark}")

    # --- Interactive ---------------------------------------------------------------------------

    def _read_line(self) -> str | None:
        """The next line typed, or None at end of input (Ctrl-D) or Ctrl-C at the prompt."""
        try:
            if self.stdin is sys.stdin and sys.stdin.isatty():
                return input("you> ")  # line editing and history when the readline module is loaded
            self.stdout.write("you> ", ending="")
            self.stdout.flush()
            line = self.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            return None
        return line.rstrip("\n") if line else None

    def interactive(self) -> None:
        where = (f"conversation {self.conversation.pk}" if self.conversation
                 else f"a new conversation with profile {self.profile_name!r}")
        self.stdout.write(f"Chatting in {where}. /quit or Ctrl-D leaves; Ctrl-C stops an answer.")
        while True:
            line = self._read_line()
            if line is None or line.strip() in QUIT_COMMANDS:
                break
            if not line.strip():
                continue
            try:
                text = self._validated(line)
                self.answer(text)
            except CommandError as exc:  # bad input or a turn in progress: say so, keep chatting
                self.stderr.write(str(exc))
        self.stdout.write("")
        if self.conversation is not None:
            self.stdout.write(f"conversation: {self.conversation.pk}")
