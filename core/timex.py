"""Time expressions in chat turns, resolved to calendar dates against the time they were said.

"I went to a support group yesterday", said at 1:56 pm on 8 May 2023, is about 7 May 2023.
`resolve(text, anchor)` finds such expressions and returns the span of days each one means
(`TimeSpan`, inclusive); `query_dates(question)` finds the absolute dates a question names
("on May 3, 2023", "in May 2023", "in May", "in 2022"); `asks_when(question)` tells a
question that asks for a time. core.recall indexes the spans of every turn, so a question
reaches the turn on the date the event happened, not the date it was mentioned.

Forms resolved (the anchor is the session's date `d`):

| form | span |
|---|---|
| today, tonight, this morning/afternoon/evening | d |
| yesterday, last night, the day before / prior, the previous day (end of clause); the day before yesterday, the night before last | d-1; d-2 |
| tomorrow; the day after tomorrow | d+1; d+2 |
| in two weeks, in a few days, in a month or so (a sentence about the future or in the present tense) | that day, week or month ahead |
| two days from now, a few weeks from now; the week (weekend, month, year) after next | that day, week or month ahead |
| the past / the last few days (weeks, months) | the days up to `d` |
| the next few days (weeks, months), the next two weeks, the coming weeks (a count or a plural, in a sentence about the future or in the present tense) | the days from `d` on |
| N days (nights) ago, a couple of / a few / several days ago, the other day | d-N; a range of days |
| the other week | the one to three weeks before |
| N weeks back, a fortnight ago, a month or so ago, a week or two ago, a decade ago; it's been (about) N years since | as "ago" (a fortnight: two weeks; a decade: ten years) |
| half a year ago, a year and a half ago, two and a half years ago | that month |
| on Friday, since Friday, Friday night (morning, ...; no last/next), over / on / at / for the weekend; Friday alone (a capital, in a sentence that tells what happened or what is to come: "We went hiking Saturday", "See you Tuesday!") | the last one, or the coming one when the sentence speaks of the future, or its clause is in the present tense (a timetable's verbs too: "I start on Monday", "The shop opens on Saturday") and tells nothing past or habitual ("My recital is on Saturday", "Are you free on Friday?", "Oren found a flat and I start on Monday"; a present state a past day left, "I'm still sore from the game on Saturday", reads as the coming one too) |
| last / this / next Christmas (Xmas, Christmas Eve, New Year's Eve or Day, Thanksgiving, Easter, Halloween, Valentine's Day, the Fourth of July); on / for / over / since Christmas; over Memorial Day (Labor Day, Thanksgiving, Easter) weekend | that day (US Thanksgiving); without last/next, the last one or, in a clause about the future, the coming one; its weekend: the days off it makes (Saturday-Monday, Thursday-Sunday, Good Friday-Easter Monday) |
| last / this past / next / this Friday (and Fri, Tues, Thurs, Wed) | that weekday's date |
| last / this / next week, N weeks ago, the week before last, the week before / prior, the previous week (end of clause) | that Monday-Sunday week |
| last / this past / this / next weekend, N weekends ago, the weekend before last | that Saturday-Sunday ("this weekend" said on a Monday or Tuesday: the one just over, unless the sentence speaks of the future or is in the present tense) |
| last / this / next month, N months ago, the month before last; earlier / later this month (week, year), earlier in the week | that calendar month; its days up to / from `d` (none when they would run backward: "earlier this weekend" said on a Wednesday) |
| the beginning (start, middle, end) of last / this / next week, month or year, the end of the month, early last week, late last year | its first, middle or last third (Monday-Wednesday, Tuesday-Thursday, Thursday-Sunday; days 1-10, 11-20, 21-; January-April, May-August, September-December) |
| last / this / next year, N years ago, a few years ago | that calendar year (or years) |
| last / this / next summer (spring, fall, autumn, winter) | that season (northern, by months) |
| the summer of 2021, fall 2022, the summer of last year; early / mid / late 2022, the beginning (middle, end) of 2021 | that season of that year; its first, middle or last four months |
| two summers ago, a few winters back; two Fridays ago; two Christmases (Thanksgivings, Easters, Halloweens) ago; (the) summer (winter, Christmas, ...) before last | the last such season (weekday, holiday) and the ones before it |
| two weeks ago today, a year ago today, a month from today; (the) Tuesday before last | that very day; the weekday a week before the last one |
| a week from Friday, two weeks from tomorrow, three days from Monday; (the) Friday after next | so long after the coming Friday (tomorrow); the Friday a week after the coming one |
| on Friday last week, Tuesday of next week, last week on Friday | that weekday of that Monday-Sunday week |
| over / during / in / for the summer (spring, fall, winter), over the holidays; on the 3rd (where the clause ends) | in a sentence that tells what happened the last one (the holidays: 24 December - 1 January), in one about the future the coming one; none in a habit ("I swim in the summer") |
| in May, last May, next May, early June, mid-May, the end of June, May 3, 3 May, May 2023, 3 May 2023; the first of May, May first, June the 3rd, the twenty-first of April | the month or day; without a year, the one nearest `d` (last/next: before/after), but the last one in a sentence told in the past tense ("We went to Paris in June") and the coming one in a sentence about the future ("I'll visit in April") |
| in March last year, last year in March, on May 3rd of next year, early June this year | that month (or day, or part of the month) of the year named |
| the 3rd (the first, the fifteenth) of last / this / next month; of the month (in a sentence that tells or looks ahead) | that day of that month; of the month: the last such day, or the coming one |
| the first (second, third, fourth, last) week or weekend of May (2023) | days 1-7 (8-14, ..., the last seven); that Saturday-Sunday |
| in 2022, since 2019, back in 2020 | that year |

A duration up to the time said, in a present-perfect clause ("I've had them for three years",
"we've been married for 5 years", "has known her for about a few months", "we've been married
5 years now") or opening a clause or a reply ("Seven years now, and I've ...", "5 years
already!"), resolves to when it began:
"for three years" said in 2023 is 2020 (described "since 2020"), so "which year did she get
them" reaches the turn through its indexed date.

Look-alikes left alone: a duration that does not run up to the time said ("a week of rain",
"a course for 3 years", "I had a fever for 3 days", "I have to leave for two weeks"), a
relative phrase anchored on an event ("the week before the wedding", "the day I was born":
`resolve` leaves it; core.recall dates "the week before the wedding", "the day after the
race", "two weeks after the wedding" and "since the race" from the earlier sentence that dated
the event, `event_anchors`),
a noun after last/next ("last time", "next step"), "may" and "march" as verbs (a month needs a
capital letter there, or a preposition or a day or year beside it), a habit ("on Fridays", "on
weekends", "on Monday mornings", "every Friday night", "Friday nights", "I swim in the
summer", "Rent is due on the 1st", "Saturday is my day off", "I always run Sunday"), a
weekday that names something else ("Black Friday", "Sunday school", "a Sunday like any
other", "called Friday"), an idiom ("at the end of the day"), a length of time in
the past ("I lost 5 pounds in two weeks"), "back" as a place ("a few days back home"), an
ordinal ("the 3rd floor"), "the summer months", a holiday as a kind of thing ("a Christmas
tree", "my Halloween costume": a holiday needs last/next or a preposition).

Why our own grammar (python-dateutil parses the session times and does the calendar
arithmetic, `relativedelta`): the maintained parsers of free text (dateparser, parsedatetime,
ctparse, Recognizers-Text) were measured on the forms above and their look-alikes and each
misread some, or was too slow for bulk ingest: docs/decisions/time-expressions.md.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache

from dateutil import parser as date_parser
from dateutil.easter import easter
from dateutil.relativedelta import relativedelta

_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_MONTH_NUMBER = (
    {name: i + 1 for i, name in enumerate(_MONTHS)}
    | {name[:3]: i + 1 for i, name in enumerate(_MONTHS) if name not in ("may", "march")}
    | {"sept": 9}
)
_WEEKDAYS = {
    "monday": 0,
    "tuesday": 1,
    "wednesday": 2,
    "thursday": 3,
    "friday": 4,
    "saturday": 5,
    "sunday": 6,
    "tues": 1,
    "tue": 1,
    "wed": 2,
    "thurs": 3,
    "thur": 3,
    "thu": 3,
    "fri": 4,
}
_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
_ORDINAL_WORDS = (
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
    "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth"
).split()
#: Days of the month in words: "first" 1 ... "twentieth" 20, "twenty-first" 21, ..., "thirtieth"
#: 30, "thirty-first" 31 (with a hyphen or a space).
_DAY_WORDS = (
    {word: i + 1 for i, word in enumerate(_ORDINAL_WORDS)}
    | {f"twenty-{word}": 21 + i for i, word in enumerate(_ORDINAL_WORDS[:9])}
    | {"thirtieth": 30, "thirty-first": 31}
)
#: Vague counts: (fewest, most) units.
_VAGUE = {
    "a couple of": (2, 3),
    "a couple": (2, 3),
    "couple of": (2, 3),
    "couple": (2, 3),
    "a few": (2, 4),
    "few": (2, 4),
    "several": (3, 6),
    "some": (2, 6),
}
#: Meteorological seasons (northern hemisphere): first month, months long.
_SEASONS = {"spring": 3, "summer": 6, "fall": 9, "autumn": 9, "winter": 12}
#: Holidays on a fixed day: (month, day).
_FIXED_HOLIDAYS = {
    "christmas eve": (12, 24),
    "christmas day": (12, 25),
    "christmas": (12, 25),
    "xmas": (12, 25),
    "new year's eve": (12, 31),
    "new year's day": (1, 1),
    "new year's": (1, 1),
    "halloween": (10, 31),
    "valentine's day": (2, 14),
    "valentine's": (2, 14),
    "independence day": (7, 4),
    "the fourth of july": (7, 4),
    "fourth of july": (7, 4),
    "the 4th of july": (7, 4),
    "4th of july": (7, 4),
    "st. patrick's day": (3, 17),
    "st patrick's day": (3, 17),
    "saint patrick's day": (3, 17),
}
#: The United States' holidays on a weekday of their month: (month, weekday, which: 0 the
#: first, -1 the last).
_WEEKDAY_HOLIDAYS = {
    "memorial day": (5, 0, -1),
    "labor day": (9, 0, 0),
    "mother's day": (5, 6, 1),
    "father's day": (6, 6, 2),
}
_HOLIDAY_RE = (
    r"(?:christmas|xmas)(?:\s+(?:eve|day))?|new\s+year['\u2019]?s(?:\s+(?:eve|day))?|thanksgiving|easter"
    r"|halloween|valentine['\u2019]?s(?:\s+day)?|independence\s+day|(?:the\s+)?(?:fourth|4th)\s+of\s+july"
    r"|memorial\s+day|labou?r\s+day|mother['\u2019]?s\s+day|father['\u2019]?s\s+day"
    r"|(?:st\.?|saint)\s+patrick['\u2019]?s\s+day"
)
#: A clause about what is still to come: its "on Friday" or "over the weekend" is the coming
#: one; otherwise the last one (a chat mostly tells what happened).
_FUTURE = re.compile(
    # "will" in lower case, or opening the sentence: "Will" inside one is a name ("I saw Will").
    r"\bwill\b|^\s*Will\b"
    r"|(?i:\b(?:won['\u2019]t|shall|going\s+to|gonna|plans?\s+(?:to|for)|planning\s+to|hop(?:e|es|ing)\s+to"
    r"|wants?\s+to|wanna|can['\u2019]t\s+wait|looking\s+forward|about\s+to|see\s+you)\b|['\u2019]ll\b)"
)
#: A sentence in the present tense ("The concert is in two weeks"): its "in two weeks" runs
#: ahead from the time said, as in a sentence about the future; in one about the past ("I
#: lost 5 pounds in two weeks") it is a length of time.
_PRESENT = re.compile(r"(?i:\b(?:is|are|am)\b|['\u2019](?:s|re|m)\b)")
#: A word before "Monday night" that makes it another form (or none).
_RELATION_BEFORE = re.compile(r"(?i:\b(?:last|next|this|past|coming|every)\s+)$")
_PAST = re.compile(r"(?i:\b(?:was|were|did|had|ago|last|yesterday)\b)")
#: A sentence that tells what happened: a word of `_PAST`, a regular past ("visited"; not
#: "need", "bed") or a common irregular one.
_PAST_TOLD = re.compile(
    r"(?i:\b(?:was|were|did|had|ago|last|yesterday|went|got|saw|made|took|came|met|bought|found"
    r"|left|gave|told|felt|ran|won|began|wrote|spent|brought|thought|kept|lost|sent|built|heard"
    r"|flew|drove|ate|sang|swam|became|held|taught|caught|fell|knew|grew|threw|wore|chose)\b"
    r"|\b\w{2,}(?<!e)ed\b)"
)

_MONTH_RE = "|".join(
    sorted([*_MONTHS, *(k for k in _MONTH_NUMBER if k not in _MONTHS)], key=len, reverse=True)
)
_WEEKDAY_RE = "|".join(sorted(_WEEKDAYS, key=len, reverse=True))
_COUNT_RE = r"\d{1,2}|" + "|".join(sorted([*_NUMBERS, *_VAGUE], key=len, reverse=True))
_UNIT_RE = r"days?|nights?|weeks?|weekends?|fortnights?|months?|years?|decades?"
_EXACT_COUNT_RE = "|".join(sorted(_NUMBERS, key=len, reverse=True))
#: "the week before" is relative to the session only where the clause ends; "the week
#: before the wedding" is relative to an event we cannot date.
_CLAUSE_END = r"(?=\s*(?:[,.;:!?)\]\u2014-]|$|\s*\b(?:and|but|so|too|though|already)\b))"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
#: A day of the month in words ("first", "twenty-first", "twenty first").
_DAY_WORD_RE = r"(?:(?:twenty|thirty)[\s-])?(?:" + "|".join(_ORDINAL_WORDS) + ")"
#: A hedge before a count ("for about three years", "been almost 3 months since"): the span is
#: the count's.
_ROUGHLY = (
    r"(?:about|almost|nearly|over|around|roughly|close\s+to|more\s+than|less\s+than|under"
    r"|just\s+(?:over|under))\s+"
)
_YEAR = r"((?:19|20)\d\d)"

#: What may come before a duration that opens a clause or a reply ("Seven years now, and ..."):
#: a speaker's "Name:" label, punctuation, an interjection.
_OPENING = re.compile(
    r"(?:[A-Z][\w .'\u2019-]{0,40}:)?[\s,:\-\u2014]*(?:(?:oh|wow|yeah|yes|um|well)[\s,!]*)*",
    re.IGNORECASE,
)

#: A present-perfect clause: "I've had", "has been", "she's been", "have known" (not "have to",
#: "has got to"; "'s" alone is "is" as often as "has").
_PERFECT = re.compile(
    r"(?:\b(?:have|has)|['\u2019]ve)\b(?!\s+(?:to|got\s+to)\b)|['\u2019]s\s+been\b", re.IGNORECASE
)

#: One end of a range of dates ("between May and July 2023", "from 3 to 10 May", "from 2019 to
#: 2021"): a month with its part, day and year as it may have them, a year, or a bare day (read
#: by `_range_end`; which ends may go together is `_range_span`'s business).
_RANGE_END = (
    rf"(?:(?:early|late|mid)[\s-]+)?(?:\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?)?(?:{_MONTH_RE})\b\.?"
    r"(?:\s+(?:the\s+)?\d{1,2}(?:st|nd|rd|th)?\b)?(?:,?\s+(?:19|20)\d\d\b)?"
    r"|(?:19|20)\d\d\b|\d{1,2}(?:st|nd|rd|th)?\b"
)
_RANGE_END_PARTS = re.compile(
    rf"(?:(?P<part>early|late|mid)[\s-]+)?(?:(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?)?"
    rf"(?:(?P<month>{_MONTH_RE})\.?(?:\s+(?:the\s+)?(?P<day2>\d{{1,2}})(?:st|nd|rd|th)?)?)?"
    r"(?:,?\s*(?P<year>(?:19|20)\d\d))?"
    r"|(?P<bare>\d{1,2})(?:st|nd|rd|th)?",
    re.IGNORECASE,
)

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        (
            "day_before_yesterday",
            r"\b(?:the\s+)?day\s+before\s+yesterday\b|\bthe\s+night\s+before\s+last\b",
        ),
        ("day_after_tomorrow", r"\b(?:the\s+)?day\s+after\s+tomorrow\b"),
        ("yesterday", r"\b(?:yesterday|last\s+night)\b"),
        ("today", r"\b(?:today|tonight|this\s+(?:morning|afternoon|evening))\b"),
        ("tomorrow", r"\btomorrow\b"),
        ("other_day", r"\bthe\s+other\s+day\b"),
        ("other_week", r"\bthe\s+other\s+week\b"),
        (
            # "two summers ago", "a few winters back": that season, so many years before the last
            "seasons_ago",
            rf"\b({_COUNT_RE})\s+(springs|summers|falls|autumns|winters)\s+(?:ago|back)\b",
        ),
        (
            "weekdays_ago",  # "two Fridays ago"
            rf"\b({_COUNT_RE})\s+(monday|tuesday|wednesday|thursday|friday|saturday|sunday)s\s+ago\b",
        ),
        (
            "ago",
            rf"\b({_COUNT_RE}|half\s+an?)(?:\s+and\s+a\s+half)?\s+({_UNIT_RE})(?:\s+and\s+a\s+half)?"
            r"(?:\s+or\s+(so|two|three|four))?\s+(?:ago\b|back\b(?!\s+(?:home|in|at|to|there|here|on|with|from|into|then|up|down)\b))",
        ),
        (
            "duration",
            rf"\bfor\s+(?:the\s+(?:past|last)\s+)?(?:{_ROUGHLY})?({_COUNT_RE})\s+({_UNIT_RE})(?:\s+now)?\b(?!\s+ago)",
        ),
        (
            # "It's been two years since I adopted Max": two years ago.
            "been_since",
            rf"\bbeen\s+(?:{_ROUGHLY})?({_COUNT_RE})\s+({_UNIT_RE})\s+since\b",
        ),
        (
            # "Seven years now, and I've ...", "5 years already!", "we've been married 5 years
            # now": a duration up to the time said without "for" (`_resolve_back` checks where).
            "running",
            rf"\b(?:{_ROUGHLY})?({_COUNT_RE})\s+({_UNIT_RE})\s+(?:now|already)\b(?!\s+(?:that|ago)\b)",
        ),
        ("before_last", r"\b(?:the\s+)?(week|weekend|month|year)\s+before\s+last\b"),
        ("weekday_before_last", rf"\b(?:the\s+)?({_WEEKDAY_RE})\s+before\s+last\b"),
        (
            # "the summer before last", "Christmas before last": the one before the last one
            # ("the" needed before a word that is also a verb: "prices fall before last call")
            "named_before_last",
            r"\b(?:the\s+(spring|fall)|(?:the\s+)?(summer|autumn|winter|christmas|thanksgiving"
            r"|easter|halloween))\s+before\s+last\b",
        ),
        (
            # "on Friday last week", "Tuesday of next week", "last week on Friday": that day of
            # that week (not the last or coming Friday, which may lie in another week)
            "weekday_of_week",
            rf"\b(?:on\s+)?(?P<weekday>{_WEEKDAY_RE})\s+(?:of\s+)?(?P<relation>last|this|next)\s+week\b"
            rf"|\b(?P<relation2>last|this|next)\s+week\s+on\s+(?P<weekday2>{_WEEKDAY_RE})\b",
        ),
        (
            # "two Christmases ago": the last one and so many years before it
            "holidays_ago",
            rf"\b({_COUNT_RE})\s+(christmases|xmases|thanksgivings|easters|halloweens)\s+(?:ago|back)\b",
        ),
        (
            # "two weeks ago today", "a month from today": that very day, not its week or month
            "ago_today",
            rf"\b(\d{{1,2}}|{_EXACT_COUNT_RE})\s+(days?|weeks?|months?|years?)\s+(ago|from)\s+today\b",
        ),
        ("after_next", r"\bthe\s+(week|weekend|month|year)\s+after\s+next\b"),
        (
            # "the Friday after next": a week after next Friday ("the Friday after next week" is
            # a day of that week, not this)
            "weekday_after_next",
            rf"\b(?:the\s+)?({_WEEKDAY_RE})\s+after\s+next\b(?!\s+(?:week|weekend|month|year)\b)",
        ),
        (
            # "a week from Friday", "two weeks from tomorrow": counted from that coming day (not
            # "a week from Friday to Friday", a length, nor "two days from Monday's deadline")
            "from_day",
            rf"\b(\d{{1,2}}|{_EXACT_COUNT_RE})\s+(days?|weeks?)\s+from\s+({_WEEKDAY_RE}|tomorrow)\b"
            r"(?!['\u2019]s\b|\s+(?:to|till|until|through|thru|on)\b)",
        ),
        (
            "from_now",
            rf"\b({_COUNT_RE})\s+({_UNIT_RE})(?:\s+or\s+(so|two|three|four))?\s+from\s+now\b",
        ),
        (
            "past_units",
            rf"\b(?:the|these|those)\s+(?:past|last)\s+({_COUNT_RE})\s+({_UNIT_RE})\b(?!\s+(?:of|before|after)\b)",
        ),
        (
            # "in the next few weeks", "over the coming months", "the next two days": the days
            # from the time said on (a count, or a plural: "the next day" is after an event)
            "next_units",
            rf"\b(?:the|these)\s+(?:next|coming)\s+(?:({_COUNT_RE})\s+({_UNIT_RE})|(days|weeks|weekends|months|years))\b"
            r"(?!\s+(?:of|before|after)\b)",
        ),
        (
            "before",
            rf"\bthe\s+(?:(day|week|weekend|month)\s+(?:before|prior)|previous\s+(day|week|weekend|month))\b{_CLAUSE_END}",
        ),
        ("weekday", rf"\b(last|this\s+past|past|next|this\s+coming|this)\s+({_WEEKDAY_RE})\b\.?"),
        (
            "on_weekday",
            rf"\b(?:on|since)\s+({_WEEKDAY_RE})\b(?!\s+(?:mornings|afternoons|evenings|nights)\b)\.?",
        ),
        (
            # "We went hiking Saturday", "See you Tuesday!": as "on Saturday", with the guards
            # of `_bare_weekday_is_a_day` (a habit, a holiday's name, a date beside it)
            "bare_weekday",
            r"\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b(?!['\u2019]?s\b)",
        ),
        (
            "weekday_part",  # "Monday morning I went ...": as "on Monday"
            r"\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\s+(?:morning|afternoon|evening|night)\b",
        ),
        ("the_weekend", r"\b(?:over|on|at|during|for)\s+the\s+weekend\b"),
        (
            "in_units",
            rf"\bin\s+(?:(?:about|around|just|only)\s+)?({_COUNT_RE})\s+({_UNIT_RE})"
            r"(?:\s+or\s+(so|two|three|four))?\b(?:['\u2019]s?\s+time\b)?(?!\s+of\b)",
        ),
        (
            "holiday",  # with last/next or a preposition: "a Christmas tree" is a kind of thing
            rf"\b(last|this\s+past|past|next|this\s+coming|this|on|at|over|for|since|during|around|until|till|by|after|before)\s+({_HOLIDAY_RE})\b"
            r"(\s+weekend\b)?",
        ),
        (
            "unit",
            r"\b(last|this\s+past|past|next|this\s+coming|this|(?:earlier|later)\s+(?:this|in\s+the))"
            r"\s+(week|weekend|month|year)\b",
        ),
        (
            # "in the last month", "over the last week": the days just before, as "the past month"
            # (not "the last week of May", a week of something else)
            "the_last_unit",
            r"\b(?:in|within|over|during|for)\s+the\s+last\s+(week|month|year)\b(?!\s+(?:of|before|after)\b)",
        ),
        (
            # "at the end of the summer", "in late spring", "early summer 2021": that month of
            # the season (of the year named, else the last one or the coming one, as the
            # sentence tells: "over the summer")
            "part_of_season",
            r"\b(?:(?:the\s+)?(beginning|start|middle|end)\s+of\s+(?:the\s+)?|(early|late|mid)[\s-]+)"
            rf"(spring|summer|fall|autumn|winter)\b(?:,?\s+(?:of\s+)?{_YEAR}\b)?",
        ),
        (
            "part_of_unit",  # "the end of last year", "the start of the month", "early last week"
            r"\b(?:(?:the\s+)?(beginning|start|middle|end)\s+of\s+(?:(last|this|next)|the)"
            r"|(early|mid|late)[\s-]+(last|this|next))\s+(week|month|year)\b",
        ),
        (
            "season",
            r"\b(last|this\s+past|past|next|this\s+coming|this)\s+(spring|summer|fall|autumn|winter)\b",
        ),
        ("season_year", rf"\b(spring|summer|fall|autumn|winter)\s+(?:of\s+)?{_YEAR}\b"),
        (
            # "over the summer", "in the fall" (not "the fall of 2020", "in the winter months"):
            # a habit ("I swim in the summer") is no date, so only in a sentence about the past
            # or the future; "the holidays": Christmas Eve to New Year's Day.
            "the_season",
            r"\b(?:over|during|in|for|through|throughout|all)\s+the\s+(spring|summer|fall|autumn|winter|holidays)\b"
            r"(?!\s+(?:of|months?|season|semester|break|term)\b)",
        ),
        (
            "day_of_month",  # "on the 3rd", where the clause ends (not "on the 3rd floor")
            rf"\bon\s+the\s+(\d{{1,2}})(?:st|nd|rd|th)\b{_CLAUSE_END}",
        ),
        (
            "week_of_month",  # "the first week of May", "the last weekend of June 2022"
            rf"\bthe\s+(first|second|third|fourth|last)\s+(week|weekend)\s+of\s+({_MONTH_RE})\b\.?"
            rf"(?:,?\s+{_YEAR}\b)?",
        ),
        (
            "part_of_year",  # "early 2022", "the end of 2021"
            rf"\b(?:(early|late|mid)[\s-]+|the\s+(beginning|start|middle|end)\s+of\s+){_YEAR}\b",
        ),
        ("day_month", rf"\b{_DAY}\s+(?:of\s+)?({_MONTH_RE})\b\.?(?:,?\s+{_YEAR}\b)?"),
        (
            "month_day",
            rf"\b({_MONTH_RE})\.?\s+(?:the\s+)?{_DAY}\b(?!\s*(?:%|am\b|pm\b|:))(?:,?\s+{_YEAR}\b)?",
        ),
        (
            # "the first of May", "the twenty-first of April, 2022": a word needs its "of"
            "word_day_month",
            rf"\b(?:the\s+)?({_DAY_WORD_RE})\s+of\s+({_MONTH_RE})\b(?!['\u2019]s\b)\.?(?:,?\s+{_YEAR}\b)?",
        ),
        (
            # "May first", "June the third" (not "in June first", where "first" is an adverb)
            "word_month_day",
            rf"(?<!\bin\s)\b({_MONTH_RE})\.?\s+(?:the\s+)?({_DAY_WORD_RE})\b(?:,?\s+{_YEAR}\b)?",
        ),
        (
            # "the 3rd of last month", "the first of the month", "on the fifteenth of this month"
            "day_of_named_month",
            rf"\b(?:on\s+)?the\s+(?:(\d{{1,2}})(?:st|nd|rd|th)|({_DAY_WORD_RE}))\s+of\s+"
            r"(the|this|last|next)\s+month\b",
        ),
        (
            "month",
            rf"\b(?:(in|on|since|during|until|till|by|from|around|of|last|next|this\s+past|this\s+coming|this|early|late|mid|end\s+of|beginning\s+of|start\s+of)[\s-]+)?"
            rf"(?:(early|late|mid)[\s-]+)?({_MONTH_RE})\b\.?(?!\s*\d{{1,2}}(?:st|nd|rd|th)?\b)(?:,?\s+{_YEAR}\b)?",
        ),
        ("year", rf"\b(?:in|since|during|from|by|around|of|back\s+in|until|till)\s+{_YEAR}\b"),
        (
            # "back in '19", "since '08", "born in '95": the year of the century the sentence's
            # tense points to (not "the '60s", a decade)
            "short_year",
            r"\b(?:in|since|during|from|by|around|of|back\s+in|until|till)\s+['\u2019](\d\d)\b(?!['\u2019]?s\b)",
        ),
        (
            # "in March last year", "on May 3rd of next year", "early June this year": the month
            # or day of the year named relative to the time said ("in March" alone is the
            # nearest March, "last year" alone the whole year: together they are one span).
            "month_of_year_said",
            rf"\b(?:(?:in|on|during|since|by|around|until|till|from|back\s+in)\s+)?"
            rf"(?:(?P<part>early|late|mid)[\s-]+)?(?:(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?)?"
            rf"(?P<month>{_MONTH_RE})\b\.?(?:\s+(?P<day2>\d{{1,2}})(?:st|nd|rd|th)?\b)?"
            rf"\s+(?:of\s+)?(?P<relation>last|this|next)\s+year\b",
        ),
        (
            # "the summer of last year", "spring this year": that season of the year named
            "season_of_year_said",
            r"\b(?P<season>spring|summer|fall|autumn|winter)\s+(?:of\s+)?(?P<relation>last|this|next)"
            r"\s+year\b",
        ),
        (
            # "last year in March", "next year, in early June"
            "year_said_month",
            rf"\b(?P<relation>last|this|next)\s+year\s*,?\s+(?:in|on|during|around|back\s+in)\s+"
            rf"(?:(?P<part>early|late|mid)[\s-]+)?(?:(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?)?"
            rf"(?P<month>{_MONTH_RE})\b\.?(?:\s+(?P<day2>\d{{1,2}})(?:st|nd|rd|th)?\b)?",
        ),
        ("iso_date", rf"\b{_YEAR}-(\d\d)-(\d\d)\b"),
        (
            # "05/14/2023", or "on 5/14" (a preposition: "24/7" and "3/5 stars" are no dates)
            "numeric_date",
            r"(?:\b(?:on|by|since|until|till|from|before|after)\s+)?(?<![\d/.])(\d{1,2})/(\d{1,2})"
            r"(?:/((?:19|20)?\d\d))?(?![\d/])",
        ),
        (
            # "between May and July 2023", "from June to August 2022", "from 3 to 10 May",
            # "from 2019 to 2021": one span from the first end's first day to the second's last
            "range",
            rf"\b(?:between|from)\s+(?P<first>{_RANGE_END})\s*(?:and|to|until|till|through|thru|-|\u2013)"
            rf"\s*(?P<second>{_RANGE_END})",
        ),
    )
]


@dataclass(frozen=True, slots=True)
class TimeSpan:
    """The days an expression means, both ends included."""

    start: date
    end: date
    phrase: str = ""
    grain: str = "day"

    @property
    def days(self) -> int:
        return (self.end - self.start).days + 1

    def overlaps(self, other: TimeSpan) -> bool:
        return self.start <= other.end and other.start <= self.end

    def label(self) -> str:
        """Words BM25 can match: "7 May 2023" for a day, "May 2023" for a week or month
        (both months when it straddles two), "2023" for a longer span."""
        if self.start == self.end:
            return f"{self.start.day} {self.start:%B %Y}"
        if (self.end - self.start).days <= 62:
            months = dict.fromkeys([f"{self.start:%B %Y}", f"{self.end:%B %Y}"])
            return " ".join(months)
        return " ".join(str(y) for y in range(self.start.year, self.end.year + 1))

    def describe(self) -> str:
        """The span for a reader: "Sunday 23 October 2022", "17-23 October 2022", "October 2022",
        "June - August 2022", "28 September - 4 October 2022", "2019", "2017-2019"."""
        if self.grain == "since":  # a duration up to the anchor: when it began
            return "since " + TimeSpan(self.start, self.end, self.phrase, "span").describe()
        first, last = self.start, self.end
        if first == last:
            return f"{first:%A} {first.day} {first:%B %Y}"
        whole_years = (first.month, first.day, last.month, last.day) == (1, 1, 12, 31)
        if whole_years:
            return str(first.year) if first.year == last.year else f"{first.year}-{last.year}"
        month_end = (last + timedelta(days=1)).day == 1
        if first.day == 1 and month_end and (first.year, first.month) == (last.year, last.month):
            return f"{first:%B %Y}"
        if (first.year, first.month) == (last.year, last.month):
            return f"{first.day}-{last.day} {last:%B %Y}"
        if first.day == 1 and month_end:  # whole months: "June - August 2022"
            if first.year == last.year:
                return f"{first:%B} - {last:%B %Y}"
            return f"{first:%B %Y} - {last:%B %Y}"
        if first.year == last.year:
            return f"{first.day} {first:%B} - {last.day} {last:%B %Y}"
        return f"{first.day} {first:%B %Y} - {last.day} {last:%B %Y}"


@dataclass(frozen=True, slots=True)
class QueryDate:
    """A date a question names: a span of days, a month of any year ("in May"), or a holiday of
    any year ("on Thanksgiving": its day in each year, core.timex's holidays)."""

    span: TimeSpan | None = None
    month: int | None = None
    holiday: str | None = None

    @property
    def precise(self) -> bool:
        """A day, a week or a month of a known year (not a year, not "May" of any year)."""
        return self.span is not None and self.span.days <= 31

    def contains(self, span: TimeSpan) -> bool:
        """`span` lies within this date, and this date is at most a month of a known year:
        "on May 3, 2023" holds "yesterday" said on May 4, not "last week"; "in 2022" or
        "in May" (any year) would tie a question to too many turns to tell one from another.
        A holiday holds a span of its day alone, in any year."""
        if self.holiday is not None:
            return span.start == span.end == _holiday(self.holiday, span.start.year)
        return (
            self.precise
            and self.span is not None
            and self.span.start <= span.start
            and span.end <= self.span.end
        )

    def matches(self, span: TimeSpan) -> bool:
        if self.span is not None:
            return self.span.overlaps(span)
        if self.holiday is not None:
            last_year = min(span.end.year, span.start.year + 1)
            return any(
                span.start <= _holiday(self.holiday, year) <= span.end
                for year in range(span.start.year, last_year + 1)
            )
        if self.month is None:
            return False
        day, last = span.start, min(span.end, span.start + timedelta(days=400))
        while day <= last:  # a span shorter than a year: test its months
            if day.month == self.month:
                return True
            day = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
        return False


@lru_cache(maxsize=4096)
def parse_when(when: str) -> date | None:
    """The date of a free-text timestamp ("1:56 pm on 8 May, 2023", "2023-05-08"), or of Unix
    time in seconds or milliseconds (SillyTavern's older chats store `send_date` so), in UTC;
    None when it names no full date (a year must be there: dateutil would fill a missing one
    from today)."""
    if when and re.fullmatch(r"\d{10}|\d{13}", when.strip()):
        seconds = int(when) / (1000 if len(when.strip()) == 13 else 1)
        return datetime.fromtimestamp(seconds, tz=UTC).date()
    if not when or not re.search(r"(?:19|20)\d\d", when):
        return None
    try:
        # The day as written: a zone's name changes nothing of it, and one dateutil does not
        # know ("AZ") would warn now and raise in a later version.
        return date_parser.parse(when, fuzzy=True, ignoretz=True).date()
    except (ValueError, OverflowError):
        return None


_ORDINALS = {"first": 0, "second": 1, "third": 2, "fourth": 3}


def _week_of_month(m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """ "the first week of May": days 1-7 (second: 8-14, ..., last: its last seven days);
    "the first weekend of May": its first Saturday and the Sunday after (last: its last)."""
    ordinal, unit, month_text, year_text = m.groups()
    if not _month_allowed(month_text):
        return None
    month = _MONTH_NUMBER[month_text.lower().rstrip(".")]
    year = int(year_text) if year_text else _tensed_year(m, anchor, month)
    first, last = _month_span(year, month)
    ordinal = ordinal.lower()
    if unit.lower() == "week":
        start = (
            last - timedelta(days=6)
            if ordinal == "last"
            else first + timedelta(weeks=_ORDINALS[ordinal])
        )
        return start, start + timedelta(days=6), "week"
    if ordinal == "last":
        saturday = last - timedelta(days=(last.weekday() - 5) % 7)
    else:
        saturday = first + timedelta(days=(5 - first.weekday()) % 7, weeks=_ORDINALS[ordinal])
    return (*_weekend(saturday), "weekend")


def _tensed_year(m: re.Match[str], anchor: date, month: int) -> int:
    """The year of a month named without one ("in June", "on June 3"): the nearest one, but the
    last one when that lies ahead and the sentence tells what happened, in the past tense only
    ("We went to Paris in June"), and the coming one when it lies behind and the sentence
    speaks of the future ("I'll visit in April")."""
    year = _nearest_month(anchor, month, "")
    sentence = _sentence(m)
    if (
        (year, month) > (anchor.year, anchor.month)
        and _PAST_TOLD.search(sentence)
        and not _FUTURE.search(sentence)
        and not _PRESENT.search(sentence)
    ):
        return year - 1
    if (year, month) < (anchor.year, anchor.month) and _speaks_of_future(m):
        return year + 1
    return year


def _month_span(year: int, month: int) -> tuple[date, date]:
    first = date(year, month, 1)
    return first, first + relativedelta(months=1, days=-1)


def _week_of(day: date) -> date:
    return day - timedelta(days=day.weekday())


def _count(word: str) -> tuple[int, int]:
    word = " ".join(word.lower().split())
    if word.isdigit():
        return int(word), int(word)
    if word in _VAGUE:
        return _VAGUE[word]
    return _NUMBERS[word], _NUMBERS[word]


def _count_units(count: str, unit: str, or_more: str | None = None) -> tuple[int, int, str]:
    """(fewest, most, unit) of "3 weeks", "a couple of days", "a week or two" ("or so": the
    count itself), "a fortnight" (two weeks)."""
    low, high = _count(count)
    if or_more and or_more.lower() != "so":
        high = max(high, _NUMBERS[or_more.lower()])
    unit = unit.lower().rstrip("s")
    if unit == "night":  # "two nights ago": counted in days
        return low, high, "day"
    if unit == "fortnight":
        return low * 2, high * 2, "week"
    if unit == "decade":
        return low * 10, high * 10, "year"
    return low, high, unit


#: "and a half" of a unit, counted in the next smaller one: (that unit, how many make one).
_HALVES = {"decade": ("year", 10), "year": ("month", 12), "month": ("week", 4), "week": ("day", 7)}


def _count_and_a_half(count: str, unit: str) -> tuple[int, int, str] | None:
    """(fewest, most, unit) of "half a year" (6 months), "a year and a half" (18 months), "two
    and a half weeks" (17 days); None for "a day and a half" (too fine to place a day)."""
    halves = _HALVES.get(unit.lower().rstrip("s"))
    if halves is None:
        return None
    smaller, per = halves
    low, high = (0, 0) if count.lower().startswith("half") else _count(count)
    return low * per + per // 2, high * per + per // 2, smaller


def _weekday(relation: str, weekday: int, anchor: date) -> date:
    """The date of "last / this past / next / this / this coming Friday" said on `anchor`."""
    if relation in ("last", "this past", "past"):
        return anchor - timedelta(days=(anchor.weekday() - weekday) % 7 or 7)
    if relation == "next":
        return anchor + timedelta(days=(weekday - anchor.weekday()) % 7 or 7)
    day = _week_of(anchor) + timedelta(days=weekday)  # this / this coming: of the anchor's week
    if relation == "this coming" and day <= anchor:
        day += timedelta(weeks=1)
    return day


def _sentence_bounds(m: re.Match[str]) -> tuple[int, int]:
    """Where the sentence a match stands in starts and ends in its text."""
    text = m.string
    start = max(text.rfind(c, 0, m.start()) for c in ".!?;") + 1
    after = m.end() - m.group(0).endswith(".")  # "on Friday." keeps its full stop
    ends = [i for i in (text.find(c, after) for c in ".!?;") if i >= 0]
    return start, min(ends, default=len(text))


def _sentence(m: re.Match[str]) -> str:
    """The sentence a match stands in."""
    start, end = _sentence_bounds(m)
    return m.string[start:end]


def _speaks_of_future(m: re.Match[str]) -> bool:
    """The sentence around a match tells what is to come ("I'll see her on Friday")."""
    return bool(_FUTURE.search(_sentence(m)))


#: A verb in the present tense that, with a day named ahead of it, tells of that day to come:
#: "My recital is on Saturday", "I'm seeing her on Friday", "We have a game on Sunday", and
#: the verbs of a timetable, which English puts in the simple present for what is planned: "I
#: start at the aquarium on Monday", "We fly out on Friday", "The course begins on Tuesday".
_PRESENT_OR_HAVE = re.compile(
    _PRESENT.pattern + r"|(?i:\b(?:have|has|start|starts|begin|begins|leave|leaves|fly|flies"
    r"|arrive|arrives|return|returns|move|moves|open|opens)\b)"
)
#: Where a sentence's second clause begins: "and" or "but" before its subject ("... found a flat
#: and I start on Monday"), so that a clause's tense is read apart from the other's. Not "and"
#: inside a name or a list ("Tom and Jerry's", "my mom and dad").
_CLAUSE_BREAK = re.compile(r"(?i:,?\s+(?:and|but|so)\s+(?=(?:I|we|he|she|they|you)\b))")


def _clause(m: re.Match[str]) -> str:
    """The clause of the sentence a match stands in (`_CLAUSE_BREAK`)."""
    start, end = _sentence_bounds(m)
    breaks = list(_CLAUSE_BREAK.finditer(m.string, start, end))
    first = max((b.end() for b in breaks if b.end() <= m.start()), default=start)
    last = min((b.start() for b in breaks if b.start() >= m.end()), default=end)
    return m.string[first:last]


def _ahead_in_the_present(m: re.Match[str]) -> bool:
    """A day named in a clause in the present tense that tells nothing past and no habit
    ("My recital is on Saturday", "Are you free on Friday?", "I'm going camping over the
    weekend", "We moved last week and I start on Monday"): English says what is planned in the
    present, so the day is the coming one. Not "We partied on Friday, I'm so tired" (told) nor
    "I'm usually at my mom's on Friday"."""
    clause = _clause(m)
    return bool(
        _PRESENT_OR_HAVE.search(clause)
        and not _PAST_TOLD.search(clause)
        and not _HABIT.search(clause)
    )


def _runs_ahead(m: re.Match[str]) -> bool:
    """ "in two weeks" counts from the time said: the sentence speaks of the future, or is in
    the present tense without a word of the past."""
    sentence = _sentence(m)
    return bool(_FUTURE.search(sentence)) or (
        bool(_PRESENT.search(sentence)) and not _PAST.search(sentence)
    )


def _holiday(name: str, year: int) -> date:
    name = " ".join(name.lower().replace("\u2019", "'").split())
    if name == "thanksgiving":  # the United States': the fourth Thursday of November
        first = date(year, 11, 1)
        return first + timedelta(days=(3 - first.weekday()) % 7 + 21)
    if name == "easter":
        return easter(year)
    name = (
        name.replace("labour", "labor")
        .replace("mothers", "mother's")
        .replace("fathers", "father's")
    )
    name = name.replace("patricks", "patrick's")
    if name in _WEEKDAY_HOLIDAYS:
        month, weekday, which = _WEEKDAY_HOLIDAYS[name]
        if which < 0:  # the last such weekday: back from the month's last day
            last = _month_span(year, month)[1]
            return last - timedelta(days=(last.weekday() - weekday) % 7)
        first = date(year, month, 1)
        return first + timedelta(days=(weekday - first.weekday()) % 7, weeks=which)
    month, day = _FIXED_HOLIDAYS[
        name.replace("new years", "new year's")
        .replace("valentines", "valentine's")
        .replace("xmas", "christmas")
    ]
    return date(year, month, day)


def _resolve_ahead_or_up_to(
    kind: str, m: re.Match[str], anchor: date
) -> tuple[date, date, str] | None:
    """Counted from the time said: "the week after next", "two days from now", "in two weeks"
    (in a sentence about the future or in the present tense), "the past few weeks" (the days
    up to it)."""
    g = m.groups()
    if kind == "after_next":
        return _unit_span(g[0], anchor, 2)
    if kind == "past_units":
        _, high, unit = _count_units(g[0], g[1])
        if high == 0:
            return None  # "the last 0 days": no days at all
        unit = "week" if unit == "weekend" else unit
        first = anchor - relativedelta(**{f"{unit}s": high})  # type: ignore[arg-type]
        return first, anchor - timedelta(days=1), "days"
    if kind == "next_units":  # "the next few weeks": from the day after, in a sentence ahead
        if not _runs_ahead(m):
            return None  # "The next two weeks were hard": after some past event
        _, high, unit = _count_units(g[0] or "few", g[1] or g[2])
        if high == 0:
            return None  # "the next 0 days": no days at all
        unit = "week" if unit == "weekend" else unit
        last = anchor + relativedelta(**{f"{unit}s": high})  # type: ignore[arg-type]
        return anchor + timedelta(days=1), last, "days"
    if kind == "in_units" and not _runs_ahead(m):
        return None  # "I lost 5 pounds in two weeks": a length of time
    low, high, unit = _count_units(g[0], g[1], g[2])
    first, _, grain = _unit_span(unit, anchor, low)
    _, last, _ = _unit_span(unit, anchor, high)
    return first, last, grain if low == high else f"{grain}s"


#: A word before a weekday that makes it a name or a kind of day: "Black Friday", "Good
#: Friday", "a Sunday", "each Monday", "called Friday" (a relation, "last Friday", is
#: `_RELATION_BEFORE`'s; "on Friday" and the like are forms of their own).
_NAMES_A_WEEKDAY = re.compile(
    r"(?i:\b(?:black|good|cyber|super|ash|easter|palm|maundy|holy|blue|freaky|man|girl|a|the|each"
    r"|of|until|till|by|from|called|named)\s+)$"
)
#: What after a weekday makes it a kind of thing or a date's name: "Sunday school", "Sunday
#: best", "Saturday Night Live", "Friday the 13th", "Friday, May 5" (the date says the day;
#: "Saturday 3pm" is a time of that day).
_AFTER_A_WEEKDAY = re.compile(
    rf"(?i:\s+(?:school|best|papers?|blues|brunch|service|mass|league|roast|dinners|night\s+live)\b"
    rf"|,?\s+(?:the\s+)?\d(?!\d?\s*(?:am|pm|a\.m|p\.m|:))|,?\s+(?:{_MONTH_RE})\b)"
)
#: A sentence about what happens as a rule: its weekday is any such day, not one.
_HABIT = re.compile(
    r"(?i:\b(?:always|usually|often|never|sometimes|every|each|typically|normally|generally"
    r"|used\s+to|would)\b)"
)


def _bare_weekday_is_a_day(m: re.Match[str]) -> bool:
    """ "We went hiking Saturday" (told) and "See you Tuesday!" (to come) name one day; not a
    lower-case "friday", "Black Friday", "a Sunday", "Sunday school", "Friday, May 5" (the date
    is read on its own), a weekday in the present tense ("Saturday is my day off") or in a
    habit ("I always run Sunday")."""
    if not m.group(1)[0].isupper():
        return False
    if _RELATION_BEFORE.search(m.string, 0, m.start()) or _NAMES_A_WEEKDAY.search(
        m.string, 0, m.start()
    ):
        return False
    if _AFTER_A_WEEKDAY.match(m.string, m.end()):
        return False
    sentence = _sentence(m)
    if _HABIT.search(sentence):
        return False
    return bool(_FUTURE.search(sentence) or _PAST_TOLD.search(sentence))


def _resolve_last_or_coming(
    kind: str, m: re.Match[str], anchor: date
) -> tuple[date, date, str] | None:
    """A weekday, the weekend or a holiday said without last/next ("on Friday", "over the
    weekend", "for Christmas"): the coming one in a clause about the future, else the last
    one. A holiday with last/this/next is that one."""
    if kind == "weekday_part" and (
        not m.group(1)[0].isupper() or _RELATION_BEFORE.search(m.string, 0, m.start())
    ):
        # "a friday night" is a kind of evening; "last Monday night" is "last Monday";
        # "every Friday night" a habit.
        return None
    if kind == "bare_weekday" and not _bare_weekday_is_a_day(m):
        return None
    g = m.groups()
    future = _speaks_of_future(m) or _ahead_in_the_present(m)
    if kind in ("on_weekday", "weekday_part", "bare_weekday"):
        day = _weekday("next" if future else "last", _WEEKDAYS[g[0].lower()], anchor)
        return day, day, "day"
    if kind == "the_weekend":
        if future:
            return _unit_span("weekend", anchor, 0)
        if anchor.weekday() == 6:  # said on a Sunday: the weekend now ending
            return anchor - timedelta(days=1), anchor, "weekend"
        return _unit_span("weekend", anchor, -1)
    relation = " ".join(g[0].lower().split())
    days = [_holiday(g[1], year) for year in range(anchor.year - 1, anchor.year + 2)]
    if relation in ("last", "this past", "past"):
        day = max(d for d in days if d < anchor)
    elif relation in ("next", "this coming"):
        day = min(d for d in days if d > anchor)
    elif relation == "this":
        day = days[1]
    elif future:
        day = min(d for d in days if d >= anchor)
    else:
        day = max(d for d in days if d <= anchor)
    if g[2]:  # "over Memorial Day weekend": the long weekend the holiday makes
        return _holiday_weekend(day)
    return day, day, "day"


def _holiday_weekend(day: date) -> tuple[date, date, str]:
    """The days off around a holiday: a Monday or Tuesday one from the Saturday before
    (Memorial Day: Saturday-Monday), a Thursday or Friday one to the Sunday after
    (Thanksgiving: Thursday-Sunday), Easter Good Friday to Monday, a weekend one its weekend,
    a Wednesday one the day alone."""
    weekday = day.weekday()
    if weekday in (0, 1):
        return day - timedelta(days=weekday + 2), day, "weekend"
    if weekday in (3, 4):
        return day, day + timedelta(days=6 - weekday), "weekend"
    if weekday == 6 and day == easter(day.year):
        return day - timedelta(days=2), day + timedelta(days=1), "weekend"
    if weekday in (5, 6):
        return day - timedelta(days=weekday - 5), day + timedelta(days=6 - weekday), "weekend"
    return day, day, "day"


#: What "mid-May", "the end of May", "the start of last year" take of their month or year.
_PART_OF = {
    "early": "early",
    "beginning": "early",
    "start": "early",
    "mid": "mid",
    "middle": "mid",
    "late": "late",
    "end": "late",
}


def _part_of(first: date, last: date, part: str) -> tuple[date, date]:
    """The first, middle or last third of a week (Monday-Wednesday, Tuesday-Thursday,
    Thursday-Sunday: "the end of the week" holds its weekend), of a month (days 1-10, 11-20,
    21-) or of a year (January-April, May-August, September-December)."""
    if (last - first).days == 6:  # a week, Monday to Sunday
        start = first + timedelta(days={"early": 0, "mid": 1, "late": 3}[part])
        return start, start + timedelta(days=2 if part != "late" else 3)
    if first.month == last.month:  # a month
        if part == "early":
            return first, first + timedelta(days=9)
        if part == "mid":
            return first + timedelta(days=10), first + timedelta(days=19)
        return first + timedelta(days=20), last
    start = first + relativedelta(months={"early": 0, "mid": 4, "late": 8}[part])
    return start, start + relativedelta(months=4, days=-1)


def _weekend(saturday: date) -> tuple[date, date]:
    return saturday, saturday + timedelta(days=1)


def _last_weekend(anchor: date) -> date:
    """Saturday of the last weekend over before `anchor` (said on a Sunday: the one before)."""
    saturday = anchor - timedelta(days=(anchor.weekday() - 5) % 7 or 7)
    return saturday if saturday + timedelta(days=1) < anchor else saturday - timedelta(days=7)


_MONTH_RELATION = {"last": "last", "this past": "last", "next": "next", "this coming": "next"}


def _nearest_month(anchor: date, month: int, relation: str) -> int:
    """The year of `month` meant on `anchor`: the nearest one, or before/after it."""
    if relation == "last":
        return anchor.year if month < anchor.month else anchor.year - 1
    if relation == "next":
        return anchor.year if month > anchor.month else anchor.year + 1
    offset = month - anchor.month
    if offset > 6:
        return anchor.year - 1
    if offset < -6:
        return anchor.year + 1
    return anchor.year


def _unit_span(unit: str, anchor: date, shift: int) -> tuple[date, date, str]:
    """The calendar unit `shift` units from the one holding `anchor` (-1: the last one)."""
    unit = unit.lower().rstrip("s")
    if unit == "day":
        day = anchor + timedelta(days=shift)
        return day, day, "day"
    if unit == "week":
        monday = _week_of(anchor) + timedelta(weeks=shift)
        return monday, monday + timedelta(days=6), "week"
    if unit == "weekend":
        if shift < 0:
            saturday = _last_weekend(anchor) + timedelta(weeks=shift + 1)
        elif shift == 0:  # the weekend holding the anchor, or the coming one
            saturday = (
                anchor - timedelta(days=1)
                if anchor.weekday() == 6
                else anchor + timedelta(days=(5 - anchor.weekday()) % 7)
            )
        else:  # the first weekend starting after the anchor, then on by weeks
            saturday = (
                anchor
                + timedelta(days=(5 - anchor.weekday()) % 7 or 7)
                + timedelta(weeks=shift - 1)
            )
        return (*_weekend(saturday), "weekend")
    if unit == "month":
        first = anchor.replace(day=1) + relativedelta(months=shift)
        return (*_month_span(first.year, first.month), "month")
    year = anchor.year + shift
    return date(year, 1, 1), date(year, 12, 31), "year"


def _season_span(season: str, anchor: date, relation: str) -> tuple[date, date]:
    """`relation` last/past: the latest season of that name over before the anchor; next: the
    first one starting after it; this: the one holding the anchor, else the nearest."""
    first_month = _SEASONS[season.lower()]
    starts = [
        date(year, first_month, 1)
        for year in (anchor.year - 2, anchor.year - 1, anchor.year, anchor.year + 1)
    ]
    spans = [(start, start + relativedelta(months=3, days=-1)) for start in starts]
    if relation in ("last", "past", "this past"):
        return max(s for s in spans if s[1] < anchor)
    if relation == "next":
        return min(s for s in spans if s[0] > anchor)
    for span in spans:
        if span[0] <= anchor <= span[1]:
            return span
    return min(spans, key=lambda s: min(abs((s[0] - anchor).days), abs((s[1] - anchor).days)))


def _month_allowed(token: str) -> bool:
    """ "may" and "march" are also verbs: as months they are written with a capital."""
    return token.lower() not in ("may", "march") or token[0].isupper()


def _resolve_match(kind: str, m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    g = m.groups()
    if kind == "day_before_yesterday":
        day = anchor - timedelta(days=2)
        return day, day, "day"
    if kind == "day_after_tomorrow":
        day = anchor + timedelta(days=2)
        return day, day, "day"
    if kind == "yesterday":
        day = anchor - timedelta(days=1)
        return day, day, "day"
    if kind == "today":
        return anchor, anchor, "day"
    if kind == "tomorrow":
        day = anchor + timedelta(days=1)
        return day, day, "day"
    if kind == "other_day":
        return anchor - timedelta(days=7), anchor - timedelta(days=1), "days"
    if kind == "other_week":  # one to three weeks back
        return _unit_span("week", anchor, -3)[0], _unit_span("week", anchor, -1)[1], "weeks"
    if kind in (
        "seasons_ago",
        "weekdays_ago",
        "holidays_ago",
        "named_before_last",
        "the_season",
        "part_of_season",
        "day_of_month",
    ):
        return _resolve_named_back(kind, m, anchor)
    if kind in ("ago", "been_since", "duration", "running"):
        return _resolve_back(kind, m, anchor)
    if kind in ("unit", "part_of_unit"):
        return _resolve_unit(kind, m, anchor)
    if kind == "the_last_unit":
        length = {"week": 7, "month": 31, "year": 365}[g[0].lower()]
        return anchor - timedelta(days=length), anchor - timedelta(days=1), "days"
    if kind == "short_year":  # ahead of the time said only in a sentence about the future
        year = 2000 + int(g[0])
        if year > anchor.year and not (_speaks_of_future(m) and year - anchor.year <= 10):
            year -= 100
        return date(year, 1, 1), date(year, 12, 31), "year"
    if kind == "before_last":
        return _unit_span(g[0], anchor, -2)
    if kind == "day_of_named_month":
        return _day_of_named_month(m, anchor)
    if kind == "weekday_of_week":
        relation = (m.group("relation") or m.group("relation2")).lower()
        weekday = _WEEKDAYS[(m.group("weekday") or m.group("weekday2")).lower()]
        day = _unit_span("week", anchor, {"last": -1, "next": 1}.get(relation, 0))[0]
        day += timedelta(days=weekday)
        return day, day, "day"
    if kind in ("weekday_before_last", "weekday_after_next", "from_day", "ago_today"):
        return _day_counted_from(kind, g, anchor)
    if kind == "before":  # "the week before", "the week prior" or "the previous week"
        return _unit_span(g[0] or g[1], anchor, -1)
    if kind == "weekday":
        day = _weekday(" ".join(g[0].lower().split()), _WEEKDAYS[g[1].lower()], anchor)
        return day, day, "day"
    if kind == "season":
        relation = " ".join(g[0].lower().split())
        first, last = _season_span(g[1], anchor, "this" if relation == "this coming" else relation)
        return first, last, "season"
    if kind in ("on_weekday", "weekday_part", "bare_weekday", "the_weekend", "holiday"):
        return _resolve_last_or_coming(kind, m, anchor)
    if kind in ("after_next", "from_now", "in_units", "past_units", "next_units"):
        return _resolve_ahead_or_up_to(kind, m, anchor)
    if kind in ("month_of_year_said", "year_said_month"):
        return _month_of_year_said(m, anchor)
    if kind == "season_of_year_said":
        return _season_of(_year_said(m, anchor), m.group("season"))
    if kind in _CALENDAR_KINDS:
        return _resolve_calendar(kind, m, anchor)
    return None


def _day_counted_from(kind: str, g: tuple[str, ...], anchor: date) -> tuple[date, date, str]:
    """One day so long before or after another: "the Tuesday before last", "the Friday after
    next", "a week from Friday", "two weeks ago today"."""
    if kind == "weekday_before_last":  # "the Tuesday before last": the one before last Tuesday
        day = _weekday("last", _WEEKDAYS[g[0].lower()], anchor) - timedelta(weeks=1)
        return day, day, "day"
    if kind == "weekday_after_next":  # "the Friday after next": the one after next Friday
        day = _weekday("next", _WEEKDAYS[g[0].lower()], anchor) + timedelta(weeks=1)
        return day, day, "day"
    if kind == "from_day":  # "a week from Friday": so long after the coming Friday (tomorrow)
        start = anchor + timedelta(days=1)
        if g[2].lower() != "tomorrow":
            start = _weekday("next", _WEEKDAYS[g[2].lower()], anchor)
        day = start + timedelta(**{f"{g[1].lower().rstrip('s')}s": _count(g[0])[0]})
        return day, day, "day"
    # "two weeks ago today", "a month from today": that day
    shift = relativedelta(**{f"{g[1].lower().rstrip('s')}s": _count(g[0])[0]})  # type: ignore[arg-type]
    day = anchor - shift if g[2].lower() == "ago" else anchor + shift
    return day, day, "day"


def _year_said(m: re.Match[str], anchor: date) -> int:
    """The year a match's `relation` group names from the time said: last, this or next year."""
    return anchor.year + {"last": -1, "this": 0, "next": 1}[m.group("relation").lower()]


def _season_of(year: int, season: str) -> tuple[date, date, str]:
    """That season of `year` (meteorological, northern: winter runs into the next year)."""
    first = date(year, _SEASONS[season.lower()], 1)
    return first, first + relativedelta(months=3, days=-1), "season"


def _month_of_year_said(m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """ "in March last year" said in 2023: March 2022; "on May 3rd next year": 3 May 2024."""
    month_text = m.group("month")
    if not _month_allowed(month_text):
        return None
    year = _year_said(m, anchor)
    month = _MONTH_NUMBER[month_text.lower().rstrip(".")]
    day_text = m.group("day") or m.group("day2")
    if day_text:
        try:
            day = date(year, month, int(day_text))
        except ValueError:
            return None
        return day, day, "day"
    first, last = _month_span(year, month)
    if m.group("part"):
        first, last = _part_of(first, last, m.group("part").lower())
    return first, last, "month"


def _resolve_back(kind: str, m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """Counted back from the time said: "three weeks ago", "half a year ago", "it's been two
    years since", and a duration up to it ("I've had them for three years")."""
    g = m.groups()
    if kind == "been_since":
        kind, g = "ago", (g[0], g[1], None)
    if kind == "ago":
        if "half" in m.group(0).lower():  # "half a year ago", "a year and a half ago"
            counted = _count_and_a_half(g[0], g[1])
            if counted is None:
                return None
            low, high, unit = counted
        else:
            low, high, unit = _count_units(g[0], g[1], g[2])
        first, _, grain = _unit_span(unit, anchor, -high)
        _, last, _ = _unit_span(unit, anchor, -low)
        if unit == "day" and low == high:
            return first, last, "day"
        return first, last, grain if low == high else f"{grain}s"
    if kind in ("duration", "running"):
        # "I've had them for three years": since three years before the anchor. Only in a
        # present-perfect clause (have/has/'ve, not "have to"); "for 3 years" elsewhere is a
        # plain length ("a course for 3 years", "I had a fever for 3 days"). "Seven years now,
        # and ...", "5 years already!" may also open a clause or a reply on their own ("in 5
        # years now" is not one: it looks ahead).
        clause = re.split(r"[.!?;]|\b(?:but|and then)\b", m.string[: m.start()])[-1]
        opens = kind == "running" and _OPENING.fullmatch(clause.split("\n")[-1])
        if not _PERFECT.search(clause) and not opens:
            return None
        low, high, unit = _count_units(g[0], g[1])
        first, _, _ = _unit_span(unit, anchor, -high)
        _, last, _ = _unit_span(unit, anchor, -low)
        return first, last, "since"
    return None


def _resolve_named_back(kind: str, m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """A season, weekday or day of the month named without last/next: "two summers ago",
    "two Fridays ago", "over the summer", "over the holidays", "on the 3rd" (the last one in a
    sentence that tells what happened, the coming one in one about the future; none in a
    habit: "I swim in the summer")."""
    g = m.groups()
    if kind == "seasons_ago":
        low, high = _count(g[0])
        first, last = _season_span(g[1].removesuffix("s"), anchor, "last")
        return first - relativedelta(years=high - 1), last - relativedelta(years=low - 1), "season"
    if kind == "weekdays_ago":
        low, high = _count(g[0])
        day = _weekday("last", _WEEKDAYS[g[1].lower()], anchor)
        return day - timedelta(weeks=high - 1), day - timedelta(weeks=low - 1), "day"
    if kind == "named_before_last":  # as "two summers ago", "two Christmases ago"
        named = (g[0] or g[1]).lower()
        if named in _SEASONS:
            first, last = _season_span(named, anchor, "last")
            return first - relativedelta(years=1), last - relativedelta(years=1), "season"
        return _holidays_back(named, 2, 2, anchor)
    if kind == "holidays_ago":
        plural = g[1].lower()
        name = {"christmases": "christmas", "xmases": "christmas"}.get(plural, plural[:-1])
        return _holidays_back(name, *_count(g[0]), anchor)
    if kind == "part_of_season" and g[3]:  # "early summer 2021"
        return _third_of_season(_season_of(int(g[3]), g[2])[0], g[0] or g[1])
    future = _speaks_of_future(m)
    if not future and not _PAST_TOLD.search(_sentence(m)):
        return None
    if kind == "day_of_month":
        return _day_of_month(int(g[0]), anchor, future)
    season = g[2] if kind == "part_of_season" else g[0]
    if season.lower() == "holidays":  # Christmas Eve to New Year's Day
        spans = [
            (date(y, 12, 24), date(y + 1, 1, 1)) for y in range(anchor.year - 1, anchor.year + 1)
        ]
    else:
        first_month = _SEASONS[season.lower()]
        starts = [date(y, first_month, 1) for y in range(anchor.year - 2, anchor.year + 2)]
        spans = [(s, s + relativedelta(months=3, days=-1)) for s in starts]
    if future:
        first, last = min(s for s in spans if s[1] >= anchor)
    else:
        first, last = max(s for s in spans if s[0] <= anchor)
    if kind == "part_of_season":
        return _third_of_season(first, g[0] or g[1])
    return first, last, "season"


def _third_of_season(first: date, part: str) -> tuple[date, date, str]:
    """The month of a season its early, middle or late part ("the end of the summer") means."""
    month = first + relativedelta(months={"early": 0, "mid": 1, "late": 2}[_PART_OF[part.lower()]])
    return (*_month_span(month.year, month.month), "month")


def _holidays_back(name: str, low: int, high: int, anchor: date) -> tuple[date, date, str]:
    """The holiday `low` to `high` times back, counting the last one before `anchor` as one."""
    last_year = max(y for y in (anchor.year - 1, anchor.year) if _holiday(name, y) < anchor)
    first, last = _holiday(name, last_year - high + 1), _holiday(name, last_year - low + 1)
    return first, last, "day" if low == high else "days"


def _day_number(text: str) -> int:
    """The day of the month a match's day group names: "3", "third", "twenty-first", "twenty
    first"; 0 (no month has it) for "thirty-second"."""
    if text.isdigit():
        return int(text)
    return _DAY_WORDS.get("-".join(text.lower().replace("-", " ").split()), 0)


def _day_of_named_month(m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """ "the 3rd of last month", "the fifteenth of next month": that day of that month; "the
    first of the month": of this month, or in a sentence that tells what happened the last such
    day and in one about the future the coming one (none in a habit: "Rent is due on the
    first of the month")."""
    digits, words, which = m.groups()
    number = _day_number(digits or words)
    which = which.lower()
    if which == "the":
        future = _speaks_of_future(m)
        if not future and not _PAST_TOLD.search(_sentence(m)):
            return None
        return _day_of_month(number, anchor, future)
    first, _, _ = _unit_span("month", anchor, {"last": -1, "next": 1}.get(which, 0))
    try:
        day = first.replace(day=number)
    except ValueError:
        return None
    return day, day, "day"


def _day_of_month(number: int, anchor: date, future: bool) -> tuple[date, date, str] | None:
    """ "on the 3rd": the last 3rd up to the anchor, or in a sentence about the future the
    first from it (a month without that day is passed over)."""
    step = 1 if future else -1
    month = anchor.replace(day=1)
    for _ in range(3):
        try:
            day = month.replace(day=number)
        except ValueError:
            day = None
        if day is not None and (day >= anchor if future else day <= anchor):
            return day, day, "day"
        month += relativedelta(months=step)
    return None


def _resolve_unit(kind: str, m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """A week, weekend, month or year by its relation ("last week", "later this month", "this
    weekend"), or a third of one ("the end of last year", "late last year")."""
    g = m.groups()
    if kind == "part_of_unit":
        part = _PART_OF[(g[0] or g[2]).lower()]
        relation = (g[1] or g[3] or "this").lower()
        first, last, _ = _unit_span(g[4], anchor, {"last": -1, "next": 1}.get(relation, 0))
        return (*_part_of(first, last, part), "months" if g[4].lower() == "year" else "days")
    if kind == "unit":
        relation, unit = " ".join(g[0].lower().split()), g[1].lower()
        relation = relation.replace(" in the", " this")  # "earlier in the week": of this one
        if relation == "past" and unit == "weekend":  # "the past weekend": the last one
            return _unit_span("weekend", anchor, -1)
        if relation == "past":  # the past week: the days just before
            length = {"week": 7, "weekend": 3, "month": 31, "year": 365}[unit]
            return anchor - timedelta(days=length), anchor - timedelta(days=1), "days"
        if unit == "weekend" and relation == "this":
            # Said on a Monday or Tuesday: the one just over, unless the sentence speaks of
            # what is to come ("We're going camping this weekend"); later in the week the
            # coming one.
            shift = -1 if anchor.weekday() in (0, 1) and not _runs_ahead(m) else 0
            return _unit_span("weekend", anchor, shift)
        shift = {"last": -1, "this past": -1, "next": 1, "this coming": 1}.get(relation, 0)
        first, last, grain = _unit_span(unit, anchor, shift)
        if relation == "earlier this":
            last = min(last, anchor)
        if relation == "later this":
            first = max(first, anchor)
        if first > last:  # "earlier this weekend" said on a Wednesday: no such days
            return None
        return first, last, grain
    return None


#: The kinds of match that name a calendar date, month or year (not relative to the anchor,
#: but for the year a bare month or day falls in).
_CALENDAR_KINDS = (
    "range",
    "iso_date",
    "numeric_date",
    "season_year",
    "part_of_year",
    "week_of_month",
    "day_month",
    "month_day",
    "word_day_month",
    "word_month_day",
    "month",
    "year",
)


def _numeric_date(kind: str, m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """ "2023-05-14"; "05/14/2023" or "on 5/14" read month first or day first as only one
    reading is a date ("14/05" is the 14th of May; "5/6" could be either, and is left), its
    year the sentence's tense's (`_tensed_year`) when it has none."""
    first, second, year_text = m.groups()
    if kind == "iso_date":
        year, month, day_number = int(first), int(second), int(year_text)
    else:
        if not year_text and not m.group(0)[0].isalpha():
            return None  # no year and no preposition: a ratio, a score, "24/7"
        a, b = int(first), int(second)
        if (a <= 12) == (b <= 12):
            return None  # both could be the month (ambiguous), or neither
        month, day_number = (a, b) if a <= 12 else (b, a)
        if year_text:
            year = int(year_text) + (2000 if len(year_text) == 2 else 0)
        else:
            year = _tensed_year(m, anchor, month)
    try:
        day = date(year, month, day_number)
    except ValueError:
        return None
    return day, day, "day"


@dataclass(frozen=True, slots=True)
class _RangeEnd:
    """One end of a range as written: what it names of a date."""

    year: int | None = None
    month: int | None = None
    day: int | None = None
    part: str | None = None


def _range_end(text: str) -> _RangeEnd | None:
    """What one end of a range names ("early May", "3 May 2023", "2019", "10"), or None."""
    m = _RANGE_END_PARTS.fullmatch(text.strip())
    if m is None:
        return None
    if m["bare"]:
        return _RangeEnd(day=int(m["bare"]))
    month_text = m["month"]
    if month_text is not None and not _month_allowed(month_text):
        return None  # "may" and "march" as verbs
    day = m["day"] or m["day2"]
    return _RangeEnd(
        year=int(m["year"]) if m["year"] else None,
        month=_MONTH_NUMBER[month_text.lower().rstrip(".")] if month_text else None,
        day=int(day) if day else None,
        part=m["part"].lower() if m["part"] else None,
    )


def _range_span(m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """ "between May and July 2023": 1 May - 31 July 2023. The second end gives the first its
    year ("from December to February 2023": December 2022) and a bare day its month ("from 3 to
    10 May"); with no year at all, the second end's month has the sentence's tense's year
    (`_tensed_year`). Not a range: numbers that are no dates ("from 3 to 10 people"), a year
    and a month without one ("from 2019 to May"), an end before the start."""
    first, second = _range_end(m["first"]), _range_end(m["second"])
    if first is None or second is None or (second.month is None and second.year is None):
        return None
    if first.month is None and first.year is None:  # a bare day: "from 3 to 10 May"
        if second.day is None or second.month is None:
            return None
        first = _RangeEnd(second.year, second.month, first.day)
    if first.month is None and second.year is None:
        return None  # "from 2019 to May": which May?
    if second.month is None:  # years: "from 2019 to 2021"
        if first.year is None or second.year is None or first.month is not None:
            return None
        start, end, grain = date(first.year, 1, 1), date(second.year, 12, 31), "years"
    else:
        order_first = (first.month or 1, first.day or 1)
        order_second = (second.month, second.day or 31)
        if second.year is not None:
            year = second.year
        elif first.year is not None:
            year = first.year + (order_second < order_first)
        else:
            year = _tensed_year(m, anchor, second.month)
        start_year = first.year or year - (order_first > order_second)
        try:
            start = _range_day(start_year, first, first_day=True)
            end = _range_day(year, second, first_day=False)
        except ValueError:
            return None  # "from 30 to 31 February"
        grain = "days" if first.day and second.day else "months"
    if start > end or end.year - start.year > 50:
        return None
    return start, end, grain


def _range_day(year: int, end: _RangeEnd, *, first_day: bool) -> date:
    """The first (or last) day an end of a range names in `year`: its day, or its month's (or
    its part's), or the year's when it names a year only."""
    if end.month is None:
        return date(year, 1, 1) if first_day else date(year, 12, 31)
    if end.day is not None:
        return date(year, end.month, end.day)
    start, last = _month_span(year, end.month)
    if end.part:
        start, last = _part_of(start, last, end.part)
    return start if first_day else last


def _resolve_calendar(kind: str, m: re.Match[str], anchor: date) -> tuple[date, date, str] | None:
    """The span of a calendar date ("3 May 2023", "May 3"), month ("early June", "May 2023")
    or year ("in 2022"); a month or day without a year is the one the sentence's tense points
    to (`_tensed_year`)."""
    g = m.groups()
    if kind == "range":
        return _range_span(m, anchor)
    if kind in ("iso_date", "numeric_date"):
        return _numeric_date(kind, m, anchor)
    if kind in ("day_month", "month_day", "word_day_month", "word_month_day"):
        day_text, month_text, year_text = (
            (g[0], g[1], g[2]) if kind.endswith("day_month") else (g[1], g[0], g[2])
        )
        if not year_text and (
            not _month_allowed(month_text) or month_text.lower().rstrip(".") not in _MONTHS
        ):
            return None  # "may 3" (verb), "Jan 5" (a name): a day needs the month's full name or a year
        month, day_number = _MONTH_NUMBER[month_text.lower().rstrip(".")], _day_number(day_text)
        year = int(year_text) if year_text else _tensed_year(m, anchor, month)
        try:
            day = date(year, month, day_number)
        except ValueError:
            return None
        return day, day, "day"
    if kind == "month":
        relation, part, month_text, year_text = g
        if not relation and not part and not year_text:
            return None  # a bare month name: "May" could start a question, "march" is a verb
        if not _month_allowed(month_text):
            return None
        month = _MONTH_NUMBER[month_text.lower().rstrip(".")]
        relation = " ".join((relation or "").lower().split())
        part = part or _PART_OF.get(relation.removesuffix(" of"))  # "mid-May", "the end of May"
        if year_text:
            year = int(year_text)
        elif relation in _MONTH_RELATION:  # "last June", "this past June", "next June"
            year = _nearest_month(anchor, month, _MONTH_RELATION[relation])
        elif relation == "this":  # "this June": of the year said, whatever the tense
            year = anchor.year
        else:
            year = _tensed_year(m, anchor, month)
        first, last = _month_span(year, month)
        if part:
            first, last = _part_of(first, last, _PART_OF.get(part.lower(), part.lower()))
        return first, last, "month"
    if kind == "year":
        year = int(g[0])
        return date(year, 1, 1), date(year, 12, 31), "year"
    if kind == "season_year":
        return _season_of(int(g[1]), g[0])
    if kind == "week_of_month":
        return _week_of_month(m, anchor)
    if kind == "part_of_year":  # early: January-April, mid: May-August, late: September-December
        part = _PART_OF[(g[0] or g[1]).lower()]
        year, first_month = int(g[2]), {"early": 1, "mid": 5, "late": 9}[part]
        first = date(year, first_month, 1)
        return first, first + relativedelta(months=4, days=-1), "months"
    return None


class _Taken:
    """The disjoint stretches of a text its matches took, in order (`bisect`): whether another
    overlaps one is a lookup, not a scan (a long text holds thousands of matches)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect.bisect_right(self._starts, start)
        # Only the stretch starting at or before `start` and the one after it can overlap.
        return (i > 0 and self._ends[i - 1] > start) or (
            i < len(self._starts) and self._starts[i] < end
        )

    def add(self, start: int, end: int) -> None:
        i = bisect.bisect_right(self._starts, start)
        self._starts.insert(i, start)
        self._ends.insert(i, end)


def resolve(text: str, anchor: date | None) -> list[TimeSpan]:
    """The time expressions of `text` as spans of days, resolved against `anchor` (the day
    the text was said); in text order, overlapping matches resolved to the longest."""
    return [span for _, span in _resolved(text, anchor)]


def date_notes(spans: Iterable[TimeSpan]) -> list[str]:
    """The days `spans` mean, for a reader, each once ("yesterday = Sunday 7 May 2023"): "Yesterday
    was crazy ... on the big screen yesterday!" names one day twice, noted as first written."""
    notes: dict[tuple[str, str], str] = {}
    for span in spans:
        described = span.describe()
        notes.setdefault((span.phrase.casefold(), described), f"{span.phrase} = {described}")
    return list(notes.values())


def deictic_dates(text: str, anchor: date | None) -> list[TimeSpan]:
    """The expressions of `text` that name days only through `anchor`, the day it is said
    ("yesterday", "last Saturday", "this weekend", "two weeks ago"), resolved against it; not a
    calendar date ("8 May 2023", "in May") and not a duration ("for three years": its words
    say the same whenever they are said)."""
    return resolved_and_deictic(text, anchor)[1]


def resolved_and_deictic(text: str, anchor: date | None) -> tuple[list[TimeSpan], list[TimeSpan]]:
    """`resolve(text, anchor)` and `deictic_dates(text, anchor)` from one pass over the
    patterns (a chat question needs both, on every turn)."""
    found = _resolved(text, anchor)
    return (
        [span for _, span in found],
        [span for kind, span in found if kind not in _CALENDAR_KINDS and span.grain != "since"],
    )


def _resolved(text: str, anchor: date | None) -> list[tuple[str, TimeSpan]]:
    """(kind, span) of each time expression of `text`, in text order (see `resolve`)."""
    if anchor is None or not text:
        return []
    found: list[tuple[int, int, str, re.Match[str]]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            found.append((m.start(), m.end(), kind, m))
    spans: list[tuple[int, str, TimeSpan]] = []
    taken = _Taken()
    for start, end, kind, m in _longest_first(found):
        if taken.overlaps(start, end):
            continue
        resolved = _resolve_match(kind, m, anchor)
        if resolved is None:
            continue
        first, last, grain = resolved
        spans.append((start, kind, TimeSpan(first, last, m.group(0).strip().rstrip("."), grain)))
        taken.add(start, end)
    return [(kind, span) for _, kind, span in sorted(spans, key=lambda s: s[0])]


def _longest_first(
    found: list[tuple[int, int, str, re.Match[str]]],
) -> list[tuple[int, int, str, re.Match[str]]]:
    """Overlapping matches: the longest wins ("on May 3, 2023" over "on May")."""
    return sorted(found, key=lambda f: (-(f[1] - f[0]), f[0]))


_ABSOLUTE = _CALENDAR_KINDS
_WHEN_QUESTION = re.compile(
    r"^\s*(?:when\b|(?:what|which)\s+(?:date|day|time|year|month|week|weekend|season)\b"
    r"|(?:in|on|during|at|around|by)\s+(?:what|which)\s+(?:date|day|time|year|month|week|weekend|season|point)\b"
    # "Around which US holiday ...", "On what public holiday ...", "Which holiday did ...?"
    r"|(?:(?:in|on|during|at|around|by|near|over)\s+)?(?:what|which)\s+(?:[a-z.]+\s+)?holiday\s+(?:did|was|were|is|does|do|had|has|will|would)\b"
    r"|(?:for\s+)?how\s+(?:long|recently|soon)\b|(?:since|around|about|roughly|approximately|by|until)\s+when\b"
    r"|how\s+many\s+(?:days|weeks|weekends|months|years)\b"
    r"|what\s+(?:was|is)\s+the\s+(?:date|day|year|month)\s+(?:of|when)\b)"
    # An order asked of two events: "Was it before or after the wedding that ...?"
    r"|\bbefore\s+or\s+after\b",
    re.IGNORECASE,
)


#: The longest text read as a question for the order of two events (`order_choice`).
MAX_QUESTION = 300
#: A choice between two events by their order: "Which came first, the yoga class or the
#: marathon?", "What happened first: the move or the new job?" (the order word just before the
#: choice), "Did she adopt the dog or move first?" (at the end).
_ORDER_CHOICE = re.compile(
    r"^\s*(?:which|what)\b.*?\b(?:first|earlier|sooner|later|last)\s*[,:]\s*(.+?),?\s+or\s+(.+?)"
    r"[\s?.!]*$"
    r"|^\s*(?:did|was|were|had|has|have)\s+(.+?)\s+or\s+(.+?)"
    r"\s+(?:first|earlier|sooner)[\s?.!]*$",
    re.IGNORECASE,
)


def order_choice(question: str) -> tuple[str, str] | None:
    """The two events a question asks to put in order ("Which came first, the yoga class or the
    marathon?": "the yoga class", "the marathon"), or None. Not a choice of anything else
    ("Who won first place, Jon or Gina?": the order word is not what the choice follows)."""
    # A question is short; the pattern's two open-ended parts cost the square of a long text.
    m = _ORDER_CHOICE.search(question) if len(question) <= MAX_QUESTION else None
    if m is None:
        return None
    first, second = (m[1], m[2]) if m[1] is not None else (m[3], m[4])
    return first.strip(), second.strip()


def asks_when(question: str) -> bool:
    """A question for a time ("When did...", "What year...", "In which month...", "How long
    ago...", "How many weeks passed between...", "Around what time of year...", "What was the
    date of...") or for the order of two events ("... before or after ...", "Which came first,
    A or B?": `order_choice`)."""
    return bool(_WHEN_QUESTION.search(question)) or order_choice(question) is not None


#: A holiday a question names as the time of what it asks ("What did Jon do on Thanksgiving?").
_QUESTION_HOLIDAY = re.compile(
    rf"\b(?:on|at|over|for|during|around)\s+({_HOLIDAY_RE})\b", re.IGNORECASE
)


def query_dates(question: str) -> list[QueryDate]:
    """The absolute dates a question names: "on May 3, 2023", "in May 2023", "in 2022", "in May"
    (May of any year) and "on Thanksgiving" (of any year). Relative ones ("last week", "last
    Christmas", "after Christmas") have no anchor in a question."""
    dates: list[QueryDate] = []
    found: list[tuple[int, int, str, re.Match[str]]] = []
    for kind, pattern in _PATTERNS:
        if kind in _ABSOLUTE:
            found.extend((m.start(), m.end(), kind, m) for m in pattern.finditer(question))
    found.extend((m.start(), m.end(), "holiday", m) for m in _QUESTION_HOLIDAY.finditer(question))
    # A bare year anywhere ("2022's", "(2023)") names that year too.
    found.extend(
        (m.start(), m.end(), "bare_year", m) for m in re.finditer(rf"\b{_YEAR}\b", question)
    )
    taken = _Taken()
    for start, end, kind, m in _longest_first(found):
        if taken.overlaps(start, end):
            continue
        if kind == "holiday":
            dates.append(QueryDate(holiday=m.group(1)))
            taken.add(start, end)
            continue
        if kind == "bare_year":
            year = int(m.group(1))
            dates.append(
                QueryDate(span=TimeSpan(date(year, 1, 1), date(year, 12, 31), m.group(0), "year"))
            )
            taken.add(start, end)
            continue
        if kind == "range":
            ranged = _range_query_dates(m)
            if ranged:
                dates.extend(ranged)
                taken.add(start, end)
            continue
        groups = m.groups()
        year_text = groups[-1]
        if kind == "month" and not year_text:
            relation, part, month_text, _ = groups
            if (
                (relation or part)
                and _month_allowed(month_text)
                and " ".join((relation or "").lower().split()) not in (*_MONTH_RELATION, "this")
            ):
                dates.append(QueryDate(month=_MONTH_NUMBER[month_text.lower().rstrip(".")]))
                taken.add(start, end)
            continue
        if kind in ("day_month", "month_day") and not year_text:
            month_text = groups[1] if kind == "day_month" else groups[0]
            if _month_allowed(month_text):
                dates.append(QueryDate(month=_MONTH_NUMBER[month_text.lower().rstrip(".")]))
                taken.add(start, end)
            continue
        resolved = _resolve_match(kind, m, date(int(year_text), 1, 1)) if year_text else None
        if resolved is not None:
            dates.append(
                QueryDate(span=TimeSpan(resolved[0], resolved[1], m.group(0).strip(), resolved[2]))
            )
            taken.add(start, end)
    return dates


def _range_query_dates(m: re.Match[str]) -> list[QueryDate]:
    """A range a question names: its span when it has a year ("between May and July 2023"),
    else each month it runs over, of any year ("between March and May": March, April, May)."""
    years = re.findall(r"(?:19|20)\d\d", m.group(0))
    # The anchor only stands in for the year a yearless range leaves to the tense.
    resolved = _range_span(m, date(int(years[-1]) if years else 2000, 1, 1))
    if resolved is None:
        return []
    first, last, grain = resolved
    if years:
        return [QueryDate(span=TimeSpan(first, last, m.group(0).strip(), grain))]
    months: list[int] = []
    day = first.replace(day=1)
    while day <= last and len(months) < 12:
        months.append(day.month)
        day += relativedelta(months=1)
    return [QueryDate(month=month) for month in months]


#: A day, week or month before or after an event the chat named ("the week before the
#: wedding", "the night after the race", "right after the race": the days next to it), or the
#: time since it ("since the wedding"): relative
#: to the event, not to the time said, so it is dated only when an earlier sentence dated the
#: event (core.recall.documents.EventCalendar). The event is up to three words after a
#: determiner; which of them names it is the calendar's business.
_EVENT_ANCHOR = re.compile(
    r"\b(?:the\s+(?P<unit>day|night|morning|evening|week|weekend|month)\s+(?P<order>before|after)"
    rf"|(?P<count>{_COUNT_RE})\s+(?P<counted>days?|weeks?|months?|years?)\s+(?P<counted_order>before|after)"
    r"|(?P<since>since)|(?:right|just|shortly|soon|straight|immediately)\s+(?P<near>before|after))\s+"
    r"(?:the|my|our|his|her|their|your)\s+(?P<event>(?:[a-z][a-z'\u2019-]*\s+){0,2}[a-z][a-z'\u2019-]*)",
    re.IGNORECASE,
)
#: Words that make the phrase another form, or no event: "since our last chat" (a greeting),
#: "the week after the first", "since the summer" (a time, core.timex's own forms).
_ENDS_CLAUSE = re.compile(r"\s*(?:[,.;:!?)\]\u2014-]|$|(?:and|but|so|too)\b)", re.IGNORECASE)
_NOT_EVENTS = frozenset(
    """
last first next previous same whole other new beginning start end middle rest time day night morning
evening week weekend month year summer spring fall autumn winter holidays moment while
""".split()
)


@dataclass(frozen=True, slots=True)
class EventAnchor:
    """A phrase relative to an event: "the week before the wedding" (`unit` week, `after`
    False), "since the race" (`unit` "since"), "right after the race" (`unit` "near");
    `words` are the event's candidate words
    (lowercased, as said), `start` where the phrase begins in the text."""

    start: int
    prefix: str
    unit: str
    after: bool
    words: tuple[str, ...]
    #: Per word of `words`: whether its clause ends after it (`_ENDS_CLAUSE`).
    closes: tuple[bool, ...] = ()
    #: "two days after the race": (fewest, most) `unit`s from the event; (0, 0): not counted.
    count: tuple[int, int] = (0, 0)

    def names_event(self, used: int) -> bool:
        """Whether its first `used` words can name the event. "since" is also "because" ("since
        the wait can be hard", "since my movie did well"): as a time it ends its clause there
        ("I've felt great since the race.", "Since the wedding, ..."). "Right after" is as often
        followed by a clause ("right after my mom called"), whose subject is no event: it too
        must end its clause ("We flew out right after the wedding.")."""
        return self.unit not in ("since", "near") or self.closes[used - 1]

    def phrase(self, used: int) -> str:
        """The phrase up to the event's `used` words: "the week before the wedding"."""
        return f"{self.prefix} {' '.join(self.words[:used])}"


def event_anchors(text: str) -> list[EventAnchor]:
    """The phrases of `text` that are relative to an event it names (`_EVENT_ANCHOR`)."""
    found = []
    for m in _EVENT_ANCHOR.finditer(text):
        words = tuple(w.lower() for w in m["event"].split())
        if words[0] in _NOT_EVENTS:
            continue
        prefix = m.group(0)[: m.start("event") - m.start()].strip()
        count = _count(m["count"]) if m["count"] else (0, 0)
        unit = (m["unit"] or ("since" if m["since"] else "near")).lower()
        if m["counted"]:
            unit = m["counted"].lower().rstrip("s")
        ends = [w.end() + m.start("event") for w in re.finditer(r"\S+", m["event"])]
        closes = tuple(bool(_ENDS_CLAUSE.match(text, end)) for end in ends)
        after = (m["order"] or m["counted_order"] or m["near"] or "").lower() == "after"
        found.append(EventAnchor(m.start(), prefix, unit, after, words, closes, count))
    return found


def from_event(anchor: EventAnchor, used: int, event: TimeSpan, said: date) -> TimeSpan | None:
    """The span `anchor` means once its event (its first `used` words) is known to be `event`:
    so many days, weeks, months or years before its first day or after its last ("two weeks
    after the wedding": that day; "a few days before the race": those days),
    the day (night, morning, evening) before its first day or after its last, the seven days
    (the month) up to it or after it (right before or after it: the seven days), the weekend before or after it; "since" it: when it began (the
    event's own days, described "since ..." as a duration up to the time said is), none when
    the event comes after `said`."""
    phrase = anchor.phrase(used)
    if anchor.count != (0, 0):  # "two weeks after the wedding": that day (vague: those days)
        low, high = anchor.count
        sign = 1 if anchor.after else -1
        base = event.end if anchor.after else event.start
        near, far = (
            base + sign * relativedelta(**{f"{anchor.unit}s": n})  # type: ignore[arg-type]
            for n in (low, high)
        )
        first, last = sorted((near, far))
        return TimeSpan(first, last, phrase, "day" if first == last else "days")
    if anchor.unit == "since":
        if event.start > said:
            return None
        return TimeSpan(event.start, event.end, phrase, "since")  # when it began, as "for 3 years"
    if anchor.unit in ("day", "night", "morning", "evening"):
        day = event.end + timedelta(days=1) if anchor.after else event.start - timedelta(days=1)
        return TimeSpan(day, day, phrase, "day")
    if anchor.unit == "weekend":
        saturday = (
            event.end + timedelta(days=(5 - event.end.weekday()) % 7 or 7)
            if anchor.after
            else _last_weekend(event.start)
        )
        return TimeSpan(*_weekend(saturday), phrase, "weekend")
    length = relativedelta(months=1) if anchor.unit == "month" else relativedelta(weeks=1)
    if anchor.after:  # the seven days (the month) after it
        return TimeSpan(event.end + timedelta(days=1), event.end + length, phrase, "days")
    return TimeSpan(event.start - length, event.start - timedelta(days=1), phrase, "days")
