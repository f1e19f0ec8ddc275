"""When an asker's row is dated, and which of their rows a question's time asks for.

A site's rows say their date in words its ``text()`` wrote ("Tuesday 8 December 2026 at 10:00",
"Friday 11 December", "2026-12-08"), in the site's ``TIME_ZONE``. A question about the asker's
own things may ask for the next one ("When is my next loan due?") or a window of time ("What do
I have booked this week?"): the answerer reads the rows' dates to order and keep them. The
month names and the window phrases are the language's (``words.toml`` ``months``,
``patterns.toml`` ``time_window``); the windows' spans are computed here.
"""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta

# "6pm", "10.30am", "at 10:00", "18:30", "at 18.30"; not "£6.50" nor "1.25 litres".
_CLOCK_RE = re.compile(r"\b(?:at\s+)?(?P<h>\d{1,2})(?:[:.](?P<m>\d{2}))?\s*(?P<ap>am|pm)\b"
                       r"|(?<![\d$€£¥.,])(?:at\s+)?(?P<h2>\d{1,2}):(?P<m2>\d{2})(?!\d)"
                       r"|\bat\s+(?P<h3>\d{1,2})\.(?P<m3>\d{2})(?!\d)", re.IGNORECASE)
_ISO_RE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2}))?\b")
#: How far after a date its time of day may be written ("8 December 2026 at 10:00").
_CLOCK_REACH = 24


class DateReader:
    """Reads the dates written in a text with ``months`` (the language's month names, in order;
    a name's first three letters stand for it too). A date without a year is the one nearest
    today."""

    def __init__(self, months: tuple[str, ...]):
        self.month_of = {name.lower(): n for n, name in enumerate(months, 1)}
        self.month_of.update({name[:3]: n for name, n in list(self.month_of.items())})
        names = "|".join(sorted((re.escape(m) for m in self.month_of), key=len, reverse=True))
        self.day_first = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({names})\.?(?:,?\s+(\d{{4}}))?\b",
                                    re.IGNORECASE)
        self.month_first = re.compile(rf"\b({names})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(\d{{4}}))?\b",
                                      re.IGNORECASE)

    def __bool__(self) -> bool:
        return bool(self.month_of)

    def first(self, text: str, today: date) -> datetime | None:
        """The first date (and its time of day, when written just after it) in ``text``."""
        found = self.all(text, today)
        return found[0][1] if found else None

    def all(self, text: str, today: date) -> list[tuple[int, datetime]]:
        """Every date in ``text``, with where it starts, in order ("borrowed on 1 December;
        due back on 22 December": two)."""
        matches = [m for pattern in (self.day_first, self.month_first, _ISO_RE) for m in pattern.finditer(text)]
        found: list[tuple[int, datetime]] = []
        end = -1
        for match in sorted(matches, key=lambda m: m.start()):
            day = self._date(match, today) if match.start() >= end else None  # "8 December 2026" is one
            if day is not None:
                found.append((match.start(), datetime.combine(
                    day, _clock(text[match.end():match.end() + _CLOCK_REACH], match))))
                end = match.end()
        return found

    def _date(self, match: re.Match, today: date) -> date | None:
        try:
            if match.re is _ISO_RE:
                return date(int(match[1]), int(match[2]), int(match[3]))
            if match.re is self.day_first:
                day, month, year = int(match[1]), self.month_of[match[2].lower()], match[3]
            else:
                month, day, year = self.month_of[match[1].lower()], int(match[2]), match[3]
            if year:
                return date(int(year), month, day)
            return min((date(today.year + d, month, day) for d in (-1, 0, 1)), key=lambda x: abs(x - today))
        except (ValueError, KeyError):
            return None  # "31 February", a year out of range: no date


def _clock(after: str, match: re.Match) -> time:
    if match.re is _ISO_RE and match[4]:
        return time(int(match[4]), int(match[5]))
    clock = _CLOCK_RE.match(after.lstrip(" ,"))
    if clock is None:
        return time(0, 0)
    if clock["ap"]:
        hour = int(clock["h"]) % 12 + (12 if clock["ap"].lower() == "pm" else 0)
        minute = int(clock["m"] or 0)
    else:
        hour, minute = int(clock["h2"] or clock["h3"]), int(clock["m2"] or clock["m3"])
    return time(hour, minute) if hour < 24 and minute < 60 else time(0, 0)


def says_clock_time(text: str) -> bool:
    """Whether ``text`` writes a time of day ("at 10:00", "6pm", "18.30")."""
    return _CLOCK_RE.search(text) is not None


#: The windows of time ``window_span`` knows: a language's ``time_window`` names its groups so.
WINDOWS = ("today", "tomorrow", "this_week", "next_week", "this_weekend", "this_month", "next_month")


def window_span(name: str, today: date) -> tuple[date, date]:
    """The first and last day of window ``name`` (a group name of ``time_window``) from ``today``;
    a week runs Monday to Sunday, and "this week" asked on a Saturday or Sunday runs to the next
    Sunday."""
    monday = today - timedelta(days=today.weekday())
    month_start = today.replace(day=1)
    next_month = (month_start + timedelta(days=32)).replace(day=1)
    spans = {
        "today": (today, today),
        "tomorrow": (today + timedelta(days=1), today + timedelta(days=1)),
        # Said at the weekend, "this week" is the one about to start.
        "this_week": (today, monday + timedelta(days=13 if today.weekday() >= 5 else 6)),
        "next_week": (monday + timedelta(days=7), monday + timedelta(days=13)),
        "this_weekend": (max(today, monday + timedelta(days=5)), monday + timedelta(days=6)),
        "this_month": (today, next_month - timedelta(days=1)),
        "next_month": (next_month, (next_month + timedelta(days=32)).replace(day=1) - timedelta(days=1)),
    }
    return spans[name]


def asked_window(question: str, pattern: re.Pattern | None) -> tuple[str, str] | None:
    """The window of time ``question`` asks for, as (its group name, the words that say it)."""
    match = pattern.search(question) if pattern is not None else None
    if match is None:
        return None
    # A site's own pattern may name a group otherwise: that phrase asks no window known here.
    name = next((n for n, value in match.groupdict().items() if value and n in WINDOWS), None)
    return (name, match[0]) if name else None
