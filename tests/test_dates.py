"""Reading the dates a site's rows write (``answerer.dates``)."""

from datetime import date, datetime

import pytest

from django_ragchat.answerer.dates import WINDOWS, DateReader, asked_window, says_clock_time, window_span
from django_ragchat.language import load_language

ENGLISH = load_language("en")
READER = DateReader(ENGLISH.ordered["months"])
TODAY = date(2026, 12, 6)  # a Sunday


@pytest.mark.parametrize("text, expected", [
    ("You booked it on Tuesday 8 December 2026 at 10:00.", datetime(2026, 12, 8, 10, 0)),
    ("Due back on December 18, 2026.", datetime(2026, 12, 18)),
    ("Placed 28th Nov 2026, 6pm", datetime(2026, 11, 28, 18, 0)),
    ("Starts 2027-01-04 09:30 sharp", datetime(2027, 1, 4, 9, 30)),
    ("Friday 11 December at 9am", datetime(2026, 12, 11, 9, 0)),  # no year: the one nearest today
    ("on 3 January at 18.30", datetime(2027, 1, 3, 18, 30)),
    ("born 2 July", datetime(2026, 7, 2)),  # 157 days ago is nearer than 208 ahead
    ("Session 2 of 3 with Maya on 9 December 2026", datetime(2026, 12, 9)),
])
def test_the_first_date_a_text_writes(text, expected):
    assert READER.first(text, TODAY) == expected


@pytest.mark.parametrize("text", ["Open Monday to Friday.", "31 February 2026", "order 2 of 3", "March on!"])
def test_no_date(text):
    assert READER.first(text, TODAY) is None


def test_windows_of_time():
    assert window_span("today", TODAY) == (TODAY, TODAY)
    assert window_span("this_week", date(2026, 12, 2)) == (date(2026, 12, 2), date(2026, 12, 6))
    assert window_span("this_week", TODAY) == (TODAY, date(2026, 12, 13))  # asked on a Sunday: the coming week
    assert window_span("next_week", date(2026, 12, 2)) == (date(2026, 12, 7), date(2026, 12, 13))
    assert window_span("next_month", date(2026, 12, 31)) == (date(2027, 1, 1), date(2027, 1, 31))
    pattern = ENGLISH.patterns["time_window"]
    assert asked_window("What do I have booked this week?", pattern) == ("this_week", "this week")
    assert asked_window("When is my next session?", pattern) is None


def test_a_time_of_day():
    assert says_clock_time("at 10:00") and says_clock_time("from 6pm") and says_clock_time("18:30 sharp") and says_clock_time("at 18.30")
    assert not says_clock_time("lasts 90 minutes") and not says_clock_time("costs £6.50") and not says_clock_time("1.25 litres")


def test_a_sites_own_window_names_ask_no_window():
    """A site's language folder may name a ``time_window`` group otherwise: no window, no error."""
    import re

    assert asked_window("Anything this fortnight?", re.compile(r"(?P<fortnight>\bthis fortnight\b)")) is None
    assert asked_window("Anything today?", re.compile(r"\btoday\b")) is None
    assert all(window_span(name, TODAY)[0] <= window_span(name, TODAY)[1] for name in WINDOWS)
