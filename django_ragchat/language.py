"""Language data of the offline components: word lists, phrase patterns, synonyms and messages.

The offline components (the hashing embedder's content words, the followup query transformer,
the corpus's subject names, the extractive answerer) read a language through words, not a
model, and those words are data, not code: one folder per language in ``django_ragchat/lang/``
(English shipped), as NLTK and spaCy keep theirs.

``lang/<code>/``
    ``stopwords.txt``  one word per line;
    ``words.toml``     named word classes (``qualifying``, ``pronouns``, ``fillers``...);
    ``patterns.toml``  named regular expressions (``price_question``, ``ellipsis``...);
    ``synonyms.toml``  the answerer's synonym groups, classes of groups and decline nouns;
    ``messages.toml``  the answerer's sentences (its declines).

``load_language(code)`` reads a shipped language once per process; ``load_language(directory=...)``
reads a site's own folder of the same files (a profile's ``vocabulary`` setting names it, see
docs/answerer.md). Components never import this module's data: the turn runtime builds each
profile's vocabulary (``answerer.vocabulary.Vocabulary``) and hands it to the components that
ask for it.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from django.core.exceptions import ImproperlyConfigured

#: The shipped languages' folders.
LANGUAGES_DIR = Path(__file__).resolve().parent / "lang"
DEFAULT_LANGUAGE = "en"
_FILES = ("stopwords.txt", "words.toml", "patterns.toml", "synonyms.toml", "messages.toml")


@dataclass(frozen=True)
class Language:
    """One language's data, read-only. ``words`` and ``patterns`` raise ``KeyError`` naming
    the missing entry and the folder, so a site's own language files say what they lack."""

    code: str
    directory: Path
    stopwords: frozenset[str]
    words: Mapping[str, frozenset[str]]
    ordered: Mapping[str, tuple[str, ...]]  # the same lists in file order (phrases, comparatives)
    patterns: Mapping[str, re.Pattern]
    synonyms: Mapping[str, tuple[str, ...]]  # group label -> entries, in file order
    group_classes: Mapping[str, frozenset[str]]
    exact_words: frozenset[str]
    noun_of: Mapping[str, str]
    messages: Mapping[str, str]
    sources: Mapping[str, str] = field(default_factory=dict)  # pattern name -> its text

    def word_class(self, name: str) -> frozenset[str]:
        try:
            return self.words[name]
        except KeyError:
            raise KeyError(f"words.toml of {self.directory} has no word class {name!r}") from None

    def pattern(self, name: str) -> re.Pattern:
        try:
            return self.patterns[name]
        except KeyError:
            raise KeyError(f"patterns.toml of {self.directory} has no pattern {name!r}") from None


def _read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ImproperlyConfigured(f"{path} is not valid TOML: {exc}") from None


def _read_stopwords(path: Path) -> frozenset[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return frozenset(line for line in lines if line)


def _compile(name: str, source: str, path: Path) -> re.Pattern:
    try:
        return re.compile(source, re.IGNORECASE)
    except re.error as exc:
        raise ImproperlyConfigured(f"pattern {name!r} of {path} does not compile: {exc}") from None


def read_language(directory: Path, code: str = "") -> Language:
    """The language in ``directory`` (the five files of the module docstring)."""
    directory = Path(directory)
    missing = [name for name in _FILES if not (directory / name).is_file()]
    if missing:
        raise ImproperlyConfigured(f"The language folder {directory} lacks {', '.join(missing)}.")
    words = _read_toml(directory / "words.toml")
    patterns = _read_toml(directory / "patterns.toml")
    synonyms = _read_toml(directory / "synonyms.toml")
    messages = _read_toml(directory / "messages.toml")
    frozen = MappingProxyType
    return Language(
        code=code or directory.name,
        directory=directory,
        stopwords=_read_stopwords(directory / "stopwords.txt"),
        words=frozen({name: frozenset(entries) for name, entries in words.items()}),
        ordered=frozen({name: tuple(entries) for name, entries in words.items()}),
        patterns=frozen({name: _compile(name, source, directory / "patterns.toml")
                         for name, source in patterns.items()}),
        synonyms=frozen({label: tuple(entries) for label, entries in synonyms.get("groups", {}).items()}),
        group_classes=frozen({name: frozenset(groups) for name, groups in synonyms.get("classes", {}).items()}),
        exact_words=frozenset(synonyms.get("exact_words", ())),
        noun_of=frozen(dict(synonyms.get("noun_of", {}))),
        messages=frozen(dict(messages)),
        sources=frozen(dict(patterns)),
    )


@lru_cache(maxsize=16)
def load_language(code: str = DEFAULT_LANGUAGE, directory: str | None = None) -> Language:
    """A shipped language by its code, or a site's own from ``directory``; read once per process."""
    if directory:
        return read_language(Path(directory), code)
    folder = LANGUAGES_DIR / code
    if not folder.is_dir():
        shipped = ", ".join(sorted(p.name for p in LANGUAGES_DIR.iterdir() if p.is_dir()))
        raise ImproperlyConfigured(f"No language {code!r} is shipped (shipped: {shipped}); give a "
                                   f"folder of your own with the profile's vocabulary 'directory'.")
    return read_language(folder, code)
