"""What the corpus is about: the subject names a follow-up can switch to.

The offline ``followup`` transformer (``transformers.py``) needs to know that "the Nimbus Tab"
in "What about the Nimbus Tab?" names a new subject and is not a detail of the old one. Those
names come from the corpus itself, as ingestion recorded it (``Document.title`` and each chunk's
``metadata["heading_path"]``), never from a hand-made list, so a site's own catalogue works with
no configuration:

* every document title is a subject ("Zephyr Buds", "Crema One");
* a heading below the title is a subject when it is written as a name, every word capitalised
  ("Basic Plan", "Trail 700"), the text under it writes it so too ("The Basic Plan delivers..."),
  and it does not recur in several documents. A heading that many documents share ("Pricing",
  "Early Life") names a kind of section, an attribute, not a thing; a title-case section heading
  ("Personal Life", "Return Policy") is written in lower case in prose.

``subject_index(space)`` returns the names of one embedding space, cached per process and
reloaded when the documents change: one cheap aggregate query per call (the documents' row
count, highest id and newest update; ``search.freshness``), read once per turn and, where the
in-process vector index is used, the same query as its stamp.

Only the documents the reader may read name subjects (``principals``, see
``django_ragchat.access``): "the tablet" never resolves to the title of a document its reader
may not read. The index of everything is built once; each reader's view keeps the subjects of
their readable documents (cached per set of principals, a few hundred at most).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import connections
from django.db.models import Exists, OuterRef

from django_ragchat.access import Principals, current_principals
from django_ragchat.language import Language, load_language
from django_ragchat.models import Chunk, Document
from django_ragchat.search.freshness import corpus_stamp
from django_ragchat.text import HEADING_SEPARATOR, STOPWORDS, normalize, stem, words

_NAME_WORD_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")


def name_key(word: str) -> str:
    """The matching key of one word of a name or a question: folded, without a possessive
    ("Tab's"), and stemmed."""
    folded = normalize(word)
    if folded.endswith(("'s", "’s")):
        folded = folded[:-2]
    return stem(folded)


def _identifies(word: str) -> bool:
    # Stop words say nothing, but a single letter or a code is what tells "Product A" from
    # "Product B" ("a" is also a stop word).
    return word not in STOPWORDS or len(word) == 1 or any(c.isdigit() for c in word)


def _is_code(key: str) -> bool:
    """A model code ("g2", "x2"): letters and digits together. A number alone ("500") is as
    likely an amount in a question as part of a name."""
    return any(c.isdigit() for c in key) and any(c.isalpha() for c in key)


def name_tokens(name: str) -> tuple[str, ...]:
    """The keys of the words of ``name`` that identify it: stop words dropped, single letters
    and codes kept."""
    return tuple(dict.fromkeys(stem(w) for w in words(name) if _identifies(w)))


def leading_name(title: str) -> str:
    """The name a title opens with when the rest of it only describes the thing in lower case:
    "Trailblazer 300" of "Trailblazer 300 mountain bike" (a user writes the name, seldom the
    descriptor). ``title`` itself otherwise: a title written as a name ("Millstone G2 Coffee
    Grinder"), or one opening with a single capitalised word ("Returns and refunds")."""
    tokens = list(_NAME_WORD_RE.finditer(title))
    end = 0
    while end < len(tokens) and (tokens[end].group(0)[0].isupper() or tokens[end].group(0)[0].isdigit()):
        end += 1
    rest = [t.group(0) for t in tokens[end:]]
    if end < 2 or not rest or any(not w.islower() for w in rest):
        return title
    return title[:tokens[end - 1].end()]


def written_as_name(heading: str) -> bool:
    """Every word capitalised (or a code such as "X2"), at least two words: "Basic Plan"."""
    tokens = _NAME_WORD_RE.findall(heading)
    content = [t for t in tokens if normalize(t) not in STOPWORDS]
    return len(tokens) >= 2 and bool(content) and all(t[0].isupper() or t[0].isdigit() for t in content)


@dataclass(frozen=True)
class Subject:
    """One subject name: how the corpus writes it, its matching keys, the documents it names."""

    name: str
    tokens: tuple[str, ...]
    documents: frozenset[int]


_SENTENCE_END_RE = re.compile(r"[.;:!?](?=\s|$)")


def kind_of(name: str, text: str, language: Language | None = None) -> str:
    """The kind ``text`` defines ``name`` as ("tablet" for "The Nimbus Tab is an 11-inch tablet
    for drawing and reading"), folded, or "" when no sentence of the form "<name> is a/an ..." or
    "<name> are ..." (the language's ``defines_kind`` pattern) opens the text's first 600
    characters. The kind is the last word before a preposition, clause or stop (the language's
    ``kind_stop_words``: "tablet" in "an 11-inch tablet for drawing")."""
    language = language or load_language()
    defines = language.sources["defines_kind"]
    match = re.search(rf"\b{re.escape(name)}{defines}(.{{1,80}})", text[:600], re.IGNORECASE | re.DOTALL)
    if not match:
        return ""
    kind = ""
    for token in _NAME_WORD_RE.findall(_SENTENCE_END_RE.split(match.group(1))[0])[:6]:
        folded = normalize(token)
        if folded in language.word_class("kind_stop_words") or token[:1].isupper():
            break
        kind = folded
    return kind if len(kind) > 2 and kind.isalpha() and kind not in language.stopwords else ""


def _by_part_words(subjects: list[Subject]) -> dict[str, list[tuple[Subject, tuple[str, ...]]]]:
    """"root canal" names Root canal treatment, "lentil soup" the Red Lentil Soup, "chickpea
    curry" the Chickpea and Spinach Curry: a name of three words or more by all its words but the
    last, or but the first, or by its first and last words, written in a row, when no other name
    holds them so or is them (a recipe site's trials: "How many people does the lentil soup
    serve?" was read as about the curry asked of before). Keyed by the part's first word."""
    parts: dict[tuple[str, ...], list[Subject]] = {}
    ends: set[tuple[str, ...]] = set()
    for subject in subjects:
        for n in range(2, len(subject.tokens)):
            parts.setdefault(subject.tokens[:n], []).append(subject)
            parts.setdefault(subject.tokens[-n:], []).append(subject)
        if len(subject.tokens) >= 3:
            end = (subject.tokens[0], subject.tokens[-1])
            ends.add(end)
            parts.setdefault(end, []).append(subject)
    whole = {subject.tokens for subject in subjects}
    found: dict[str, list[tuple[Subject, tuple[str, ...]]]] = {}
    for part, named in parts.items():
        if len(set(named)) == 1 and part not in whole and (
                len(part) == len(named[0].tokens) - 1 or part in ends):
            found.setdefault(part[0], []).append((named[0], part))
    return found


class SubjectIndex:
    """The subject names of a corpus and how to find them in a message."""

    #: ``topic_page`` reads the documents of at most this many subjects.
    MAX_TOPIC_SCAN = 64

    def __init__(self, subjects: list[Subject], kinds: dict[str, str] | None = None,
                 language: Language | None = None,
                 document_text: Callable[[frozenset[int]], Iterable[str]] | None = None,
                 writes_all: Callable[[list[str], frozenset[int]], bool] | None = None):
        self.subjects = subjects
        self.kinds = kinds or {}
        self.language = language or load_language()
        # The texts of some documents, read only when asked (``uses``): most turns never need them.
        self.document_text = document_text
        # Whether some of those documents write every word, asked of the database: ``topic_page``
        # in a catalogue too large to read on a turn.
        self.writes_all = writes_all
        self._stems: dict[Subject, frozenset[str]] = {}
        self._by_token: dict[str, list[Subject]] = {}
        # "the tablet" names the one subject the corpus defines as a tablet ({subject name: kind}).
        by_kind: dict[str, list[Subject]] = {}
        for subject in subjects:
            for token in subject.tokens:
                self._by_token.setdefault(token, []).append(subject)
            if kinds and kinds.get(subject.name):
                by_kind.setdefault(name_key(kinds[subject.name]), []).append(subject)
        self._by_kind = {key: found[0] for key, found in by_kind.items() if len(found) == 1}
        self.kind_keys = {subject: key for key, subject in self._by_kind.items()}
        # "the G2" names the Millstone G2 Coffee Grinder: a model code one subject's name alone has.
        by_code: dict[str, list[Subject]] = {}
        for subject in subjects:
            for token in subject.tokens:
                if _is_code(token):
                    by_code.setdefault(token, []).append(subject)
        self._by_code = {key: found[0] for key, found in by_code.items() if len(found) == 1}
        # "back to the Trailblazer" names the Trailblazer 300: the words of a name with a number,
        # without the number, when no other subject's name holds them all.
        self._without_number: dict[Subject, tuple[str, ...]] = {}
        for subject in subjects:
            words_only = tuple(t for t in subject.tokens if not t.isdigit())
            if words_only and len(words_only) < len(subject.tokens) and set(self._by_token[words_only[0]]).intersection(
                    *(self._by_token[t] for t in words_only[1:])) == {subject}:
                self._without_number[subject] = words_only

        self._part_words = _by_part_words(subjects)

    def __len__(self) -> int:
        return len(self.subjects)

    def uses(self, subject: Subject, word: str) -> bool | None:
        """Whether ``subject``'s documents use ``word`` (any inflection: "blenders" is "blender");
        None when the index has no texts to read (built from rows alone). Read once per subject
        and corpus version: the index is rebuilt when the documents change."""
        if self.document_text is None:
            return None
        known = self._stems.get(subject)
        if known is None:
            known = frozenset(stem(w) for text in self.document_text(subject.documents) for w in words(text))
            self._stems[subject] = known
        return name_key(word) in known

    def topic_page(self, current: Subject, keys: list[str]) -> Subject | None:
        """The page a question's own words ``keys`` (it names nothing and points back at nothing)
        ask about instead of ``current``: "How do I contact support?" after the Millstone G2 Coffee
        Grinder asks the support page. That is a subject with no kind (a page on a topic, not an
        item of a catalogue) that writes every key, when ``current``'s documents write none of
        them and no item writes them all ("Is there a headphone jack?" after a phone whose page
        never says stays on the phone, to be declined, when the earbuds' page writes "headphone
        jack"). None otherwise, without the documents' texts, or with more than ``MAX_TOPIC_SCAN``
        topic pages (their texts are read on a turn). Over more items than that, whether one
        writes every key is asked of the database (``writes_all``), and is taken as yes without it.
        Keys that make up a topic page's whole name decide alone: "How much does delivery cost?"
        after a tyre asks the Delivery page, though the tyre's page writes "costs" too."""
        if not keys or self.document_text is None:
            return None
        names = self.topic_names_in({name_key(key) for key in keys})
        keys = [key for key in keys if name_key(key) in names] or keys
        if any(self.uses(current, key) for key in keys):
            return None
        topics = [s for s in self.subjects if s is not current and not self.kinds.get(s.name)]
        if len(topics) > self.MAX_TOPIC_SCAN:
            return None
        # A heading named inside an item's page ("Nimbus Pen") writes nothing its item does not.
        page = next((s for s in topics if all(self.uses(s, key) for key in keys)), None)
        if page is None:
            return None
        items = [s for s in self.subjects if self.kinds.get(s.name) and s is not current]
        if len(items) <= self.MAX_TOPIC_SCAN:
            written = any(all(self.uses(item, key) for key in keys) for item in items)
        else:
            written = self.writes_all is None or self.writes_all(
                [name_key(key) for key in keys], frozenset().union(*(item.documents for item in items)))
        return None if written else page

    def topic_names_in(self, keys: set[str]) -> set[str]:
        """The keys of ``keys`` that make up a whole topic page's name (a subject with no kind):
        "delivery" in what "How much is delivery?" asks, when the corpus has a Delivery page."""
        named: set[str] = set()
        for key in keys:
            for subject in self._by_token.get(key, ()):
                if not self.kinds.get(subject.name) and set(subject.tokens) <= keys:
                    named.update(subject.tokens)
        return named

    def restricted_to(self, documents: set[int]) -> SubjectIndex:
        """The index of the subjects named by ``documents`` (ids) alone."""
        kept = []
        for subject in self.subjects:
            readable = subject.documents & documents
            if readable:
                kept.append(subject if readable == subject.documents else
                            Subject(subject.name, subject.tokens, frozenset(readable)))
        names = {s.name for s in kept}
        return SubjectIndex(kept, {n: k for n, k in self.kinds.items() if n in names}, self.language,
                            self.document_text, self.writes_all)

    @classmethod
    def from_rows(cls, rows, *, named_in_text=None, openings: dict[int, str] | None = None,
                  language: Language | None = None, document_text=None, writes_all=None) -> SubjectIndex:
        """Build from (document id, title, heading path) rows, e.g. one per distinct chunk
        heading. ``named_in_text({heading: document id})``, when given, returns the headings
        whose document writes them, capitalised, in its prose ("The Basic Plan delivers..."):
        a title-case section heading ("Personal Life", "Return Policy") is not written so.
        ``openings`` ({document id: its first chunk's text}) gives each title's kind
        (``kind_of``), so "the tablet" names the Nimbus Tab. ``document_text(document ids)``, when
        given, returns those documents' texts for ``uses``; ``writes_all(stems, document ids)``
        whether one of those documents writes every stem (``topic_page``)."""
        titles, headings = _titles_and_headings(rows)
        named: dict[tuple[str, ...], Subject] = {}
        for title, documents in titles.items():
            name = leading_name(title)
            tokens = name_tokens(name)
            if not tokens:
                continue
            previous = named.get(tokens)  # two titles that differ only in case or stop words
            named[tokens] = Subject(previous.name if previous else name, tokens,
                                    frozenset(documents) | (previous.documents if previous else frozenset()))
        candidates = {}
        for name, documents in headings.items():
            tokens = name_tokens(name)
            if tokens and tokens not in named and len(documents) == 1 and written_as_name(name):
                candidates[name] = next(iter(documents))
        confirmed = set(candidates) if named_in_text is None else named_in_text(candidates)
        for name, document_id in candidates.items():
            if name in confirmed:
                named[name_tokens(name)] = Subject(name, name_tokens(name), frozenset({document_id}))
        language = language or load_language()
        kinds = _kinds(named.values(), openings or {}, language)
        return cls(sorted(named.values(), key=lambda s: (-len(s.tokens), s.name)), kinds, language, document_text,
                   writes_all)

    def kind_named(self, text: str) -> list[tuple[Subject, int]]:
        """(subject, character offset) for each "the/this/that <kind>" in ``text`` whose kind is
        one subject's alone ("What about the tablet?"). "my phone" is the user's own."""
        found = []
        for match in self.language.pattern("kind_pointer").finditer(text):
            subject = self._by_kind.get(name_key(match.group(1)))
            if subject is not None:
                found.append((subject, match.start(1)))
        return found

    def find(self, text: str, kinds: bool = True) -> list[Subject]:
        """The subjects ``text`` names, in the order it names them.

        A subject is named when all its keys are in the text and the text writes it as a name:
        one of its words capitalised or with a digit ("the Nimbus tab", "product B"), or all
        its words in a row ("the nimbus tab"). Common words that happen to make up a title
        elsewhere in the question ("that show ... daily") do not name it, nor does one word of a
        longer name ("Suns" is not "Sun Ra"). A name inside a longer one found too is dropped.
        With ``kinds``, "the tablet" also names the one subject of that kind (``kind_named``).
        """
        matches = list(_NAME_WORD_RE.finditer(text))
        keys = [name_key(m.group(0)) for m in matches]
        positions: dict[str, list[int]] = {}
        for position, (match, key) in enumerate(zip(matches, keys, strict=True)):
            # A single letter names something only in upper case: "product B", not "a product".
            if len(key) == 1 and key.isalpha() and not match.group(0).isupper():
                continue
            positions.setdefault(key, []).append(position)
        found: dict[Subject, int] = {}
        for key in list(positions):
            for subject in self._by_token.get(key, ()):
                if subject in found or not all(t in positions for t in subject.tokens):
                    continue
                used = [p for t in subject.tokens for p in positions[t]]
                written = any(matches[p].group(0)[0].isupper() or any(c.isdigit() for c in matches[p].group(0))
                              for p in used)
                if written or self._in_a_row(subject.tokens, keys, positions):
                    found[subject] = min(used)
        self._named_by_part(found, matches, keys, positions)
        chosen = [s for s in found if not any(
            other is not s and set(s.tokens) < set(other.tokens) for other in found)]
        order = {s: matches[found[s]].start() for s in chosen}
        for subject, offset in self.kind_named(text) if kinds else ():
            order.setdefault(subject, offset)
        return sorted(order, key=lambda s: order[s])

    def _named_by_part(self, found: dict[Subject, int], matches: list[re.Match], keys: list[str],
                       positions: dict[str, list[int]]) -> None:
        """Add to ``found`` the subjects named by a part of their name that only they have: the
        words without the number, all but its last or first word, its first and last, the model code."""
        for subject in dict.fromkeys(s for key in positions for s in self._by_token.get(key, ()) if s in self._without_number):
            words_only = self._without_number[subject]
            if subject not in found and all(t in positions for t in words_only) and all(
                    matches[positions[t][0]].group(0)[0].isupper() for t in words_only):
                found[subject] = min(positions[t][0] for t in words_only)
        for key in positions:
            # "a root canal" names Root canal treatment, "the lentil soup" the Red Lentil Soup:
            # all but the last or the first word of one name alone, or its first and last.
            for subject, part in self._part_words.get(key, ()):
                if subject not in found and self._in_a_row(part, keys, positions):
                    found[subject] = positions[key][0]
        for key, subject in self._by_code.items():
            # "the Millstone G2 grinder", "the G2": the code alone tells which subject, whatever
            # other words of its name are left out ("Coffee").
            if key in positions and subject not in found:
                found[subject] = positions[key][0]

    @staticmethod
    def _in_a_row(tokens: tuple[str, ...], keys: list[str], positions: dict[str, list[int]]) -> bool:
        n = len(tokens)
        if n < 2:
            return False
        return any(keys[start:start + n] == list(tokens) for start in positions[tokens[0]])


def _titles_and_headings(rows) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """The documents of each title, and of each heading below a title."""
    titles: dict[str, set[int]] = {}
    headings: dict[str, set[int]] = {}
    for document_id, title, path in rows:
        title = (title or "").strip()
        if title:
            titles.setdefault(title, set()).add(document_id)
        for heading in (path or [])[1:] if isinstance(path, list) else ():
            if isinstance(heading, str) and heading.strip() and heading.strip() != title:
                headings.setdefault(heading.strip(), set()).add(document_id)
    return titles, headings


def _kinds(subjects, openings: dict[int, str], language: Language) -> dict[str, str]:
    """{subject name: the kind its document's opening defines it as}."""
    kinds = {}
    for subject in subjects:
        for document_id in sorted(subject.documents):
            kind = kind_of(subject.name, openings.get(document_id, ""), language)
            # A kind the name itself holds counts too: "the kettle" names the Brightwater Kettle
            # when no other subject is a kettle (a name needs all its words otherwise).
            if kind:
                kinds[subject.name] = kind
                break
    return kinds


@dataclass
class _Cached:
    stamp: tuple
    index: SubjectIndex
    access: dict[int, list[str]]
    views: dict[frozenset[str], SubjectIndex]


#: Readers' views kept per cached index (one per distinct set of principals).
MAX_VIEWS = 256
#: ``writes_all`` answers yes (no topic page) past this many documents, rather than send their ids.
MAX_WRITES_ALL_DOCUMENTS = 10_000
_cache: dict[tuple[str, str, str], _Cached] = {}
_lock = threading.Lock()


def subject_index(space: str, using: str = "default", language: Language | None = None,
                  principals: Principals | None = None) -> SubjectIndex:
    """The subjects of the documents stored in embedding space ``space`` that ``principals``
    (default: the reader of the turn in progress, else the public) may read, cached (see module
    docstring), read with ``language``'s words (the default language when not given). Call from
    synchronous code (it queries the database)."""
    cached = _full_index(space, using, language or load_language())
    principals = principals if principals is not None else current_principals()
    if principals.unrestricted:
        return cached.index
    view = cached.views.get(principals.tokens)
    if view is None:
        readable = {d for d, access in cached.access.items() if principals.may_read(access or ())}
        view = cached.index if len(readable) == len(cached.access) else cached.index.restricted_to(readable)
        if len(cached.views) >= MAX_VIEWS:
            cached.views.clear()
        cached.views[principals.tokens] = view
    return view


@dataclass(frozen=True)
class _CorpusTexts:
    """What the index reads of its documents' texts on a turn, from the database."""

    space: str
    using: str

    def document_text(self, documents: frozenset[int]) -> list[str]:
        """"Do you sell blenders?": the texts of the current subject's documents."""
        return list(Chunk.objects.using(self.using).filter(space=self.space, document_id__in=list(documents))
                    .values_list("text", flat=True))

    def writes_all(self, stems: list[str], documents: frozenset[int]) -> bool:
        """Whether one of ``documents`` writes every stem: one query, each stem matched as text (a
        superset of the words it stems); yes past ``MAX_WRITES_ALL_DOCUMENTS``."""
        if len(documents) > MAX_WRITES_ALL_DOCUMENTS:
            return True
        writing = [Exists(Chunk.objects.filter(document=OuterRef("pk"), space=self.space, text__icontains=s))
                   for s in stems]
        return Document.objects.using(self.using).filter(*writing, pk__in=list(documents)).exists()


def _full_index(space: str, using: str, language: Language) -> _Cached:
    # Ingestion saves the Document row whenever it replaces its chunks (a new updated_at), and
    # ids are never reused, so this stamp changes with every change to titles or headings. The
    # documents table is far smaller than the chunks table: on PostgreSQL (no in-process vector
    # index) only the documents are counted; elsewhere the vector index's stamp of the space,
    # read once for both in a turn (search.freshness).
    stamp = corpus_stamp(space, using, chunks=connections[using].vendor != "postgresql")
    key = (using, space, str(language.directory))
    cached = _cache.get(key)
    if cached is not None and cached.stamp == stamp:
        return cached
    with _lock:
        cached = _cache.get(key)
        if cached is None or cached.stamp != stamp:
            found = (Document.objects.using(using).filter(chunks__space=space)
                     .values_list("id", "title", "access").distinct())
            titles = {document_id: title for document_id, title, _ in found}
            access = {document_id: list(tokens or ()) for document_id, _, tokens in found}
            headings = (Chunk.objects.using(using).filter(space=space)
                        .values_list("document_id", "heading").distinct())
            rows = [(document_id, titles.get(document_id, ""), heading.split(HEADING_SEPARATOR))
                    for document_id, heading in headings]
            rows += [(document_id, title, []) for document_id, title in titles.items()]

            def named_in_text(candidates: dict[str, int]) -> set[str]:
                # Only the few headings written as names are checked, in one query: the prose of
                # their documents' chunks (after the heading line) must write the name too.
                if not candidates:
                    return set()
                by_document: dict[int, list[str]] = {}
                for name, document_id in candidates.items():
                    by_document.setdefault(document_id, []).append(name)
                found = set()
                texts = Chunk.objects.using(using).filter(space=space, document_id__in=list(by_document))
                for document_id, heading, text in texts.values_list("document_id", "heading", "text").iterator():
                    prose = text[len(heading):] if heading and text.startswith(heading) else text
                    found.update(name for name in by_document[document_id] if name in prose)
                return found

            # Each document's first chunk defines what it is about ("... is an 11-inch tablet").
            openings = dict(Chunk.objects.using(using).filter(space=space, ordinal=0, document_id__in=list(titles))
                            .values_list("document_id", "text"))

            texts = _CorpusTexts(space, using)
            cached = _Cached(stamp, SubjectIndex.from_rows(rows, named_in_text=named_in_text, openings=openings,
                                                           language=language, document_text=texts.document_text,
                                                           writes_all=texts.writes_all),
                             access, {})
            _cache[key] = cached
    return cached


def clear_cache() -> None:
    """Forget every cached index (tests; the stamp makes this unnecessary in production)."""
    with _lock:
        _cache.clear()
