"""core.timex: every relative form resolves against the session's date; the look-alikes do not."""

from __future__ import annotations

from datetime import date

import pytest

from core.timex import (
    TimeSpan,
    asks_when,
    deictic_dates,
    order_choice,
    parse_when,
    query_dates,
    resolve,
)

#: Monday 8 May 2023, 1:56 pm: the first session of locomo-26.
SAID = parse_when("1:56 pm on 8 May, 2023")


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        (
            "I went to a LGBTQ support group yesterday and it was so powerful.",
            "2023-05-07",
            "2023-05-07",
        ),
        ("My mom and I made some dinner together last night!", "2023-05-07", "2023-05-07"),
        ("We're flying out tomorrow.", "2023-05-09", "2023-05-09"),
        ("It's my birthday today", "2023-05-08", "2023-05-08"),
        ("I joined a gym last week!", "2023-05-01", "2023-05-07"),
        ("Here's a pic from last Friday with some veterans.", "2023-05-05", "2023-05-05"),
        ("My car broke down last Fri on my way to work.", "2023-05-05", "2023-05-05"),
        ("We went camping two weekends ago.", "2023-04-29", "2023-04-30"),
        ("Last weekend I ran a charity race.", "2023-05-06", "2023-05-07"),
        ("I'm starting a new job next month.", "2023-06-01", "2023-06-30"),
        ("We're going to Paris in May.", "2023-05-01", "2023-05-31"),
        ("I painted that lake sunrise last year.", "2022-01-01", "2022-12-31"),
        ("I had painted it the week before, so it was dry.", "2023-05-01", "2023-05-07"),
        ("We met the week before last.", "2023-04-24", "2023-04-30"),
        ("I saw her the previous week.", "2023-05-01", "2023-05-07"),
        ("We had talked about it the week prior, so I knew.", "2023-05-01", "2023-05-07"),
        ("I donated my old car a few days ago.", "2023-05-04", "2023-05-06"),
        ("We watched it two nights ago.", "2023-05-06", "2023-05-06"),  # nights: days
        ("I first watched it around 3 years ago.", "2020-01-01", "2020-12-31"),
        ("Last summer we saw the meteor shower.", "2022-06-01", "2022-08-31"),
        ("I'll be back next Tuesday.", "2023-05-09", "2023-05-09"),
        ("The show is on 3 June 2023.", "2023-06-03", "2023-06-03"),
        ("I moved in two weeks back.", "2023-04-24", "2023-04-30"),
        ("We adopted her a fortnight ago.", "2023-04-24", "2023-04-30"),
        ("I quit a month or so ago.", "2023-04-01", "2023-04-30"),
        ("The race was a week or two ago.", "2023-04-24", "2023-05-07"),
        ("I started couple weeks ago.", "2023-04-17", "2023-04-30"),
        ("I won my fourth tournament on Friday!", "2023-05-05", "2023-05-05"),
        ("I went hiking over the weekend.", "2023-05-06", "2023-05-07"),
        ("We went to the beach in the summer of 2021.", "2021-06-01", "2021-08-31"),
        ("Last Christmas we baked cookies.", "2022-12-25", "2022-12-25"),
        ("I got this bike for Christmas.", "2022-12-25", "2022-12-25"),
        ("We hosted everyone at Thanksgiving.", "2022-11-24", "2022-11-24"),
        ("We hid eggs at Easter.", "2023-04-09", "2023-04-09"),
        # "in two weeks" runs ahead in a sentence about the future or in the present tense.
        ("The concert is in two weeks!", "2023-05-22", "2023-05-28"),
        ("See you in a couple of days", "2023-05-10", "2023-05-11"),
        ("I'm moving in a month or so.", "2023-06-01", "2023-06-30"),
        ("The wedding is two days from now.", "2023-05-10", "2023-05-10"),
        ("We fly the week after next.", "2023-05-22", "2023-05-28"),
        ("The past few days were hard.", "2023-05-04", "2023-05-07"),
        ("It rained the last couple of weeks.", "2023-04-17", "2023-05-07"),
        ("We moved here in early 2022.", "2022-01-01", "2022-04-30"),
        ("We met a decade ago.", "2013-01-01", "2013-12-31"),
        ("I quit half a year ago.", "2022-11-01", "2022-11-30"),
        ("We moved a year and a half ago.", "2021-11-01", "2021-11-30"),
        ("It's been two years since I adopted Max.", "2021-01-01", "2021-12-31"),
        ("It has been almost 3 months since the move.", "2023-02-01", "2023-02-28"),
        ("I got sick at the end of last year.", "2022-09-01", "2022-12-31"),
        ("I started at the beginning of this year.", "2023-01-01", "2023-04-30"),
        ("Late last year we bought a house.", "2022-09-01", "2022-12-31"),
        ("Rent is due by the end of the month.", "2023-05-21", "2023-05-31"),
        ("We're moving later this month.", "2023-05-08", "2023-05-31"),
        ("The fair is in mid-May.", "2023-05-11", "2023-05-20"),
        ("It opens at the end of June.", "2023-06-21", "2023-06-30"),
        ("Sunday morning I baked bread.", "2023-05-07", "2023-05-07"),
        # A month without a year: the nearest, unless the tense points back or ahead.
        ("We went to Paris in June.", "2022-06-01", "2022-06-30"),
        ("I'll visit them in April.", "2024-04-01", "2024-04-30"),
        ("I got back on June 3.", "2022-06-03", "2022-06-03"),
        ("The trip is on June 3.", "2023-06-03", "2023-06-03"),
        ("We move the first week of June.", "2023-06-01", "2023-06-07"),
        ("The fair is the last weekend of May.", "2023-05-27", "2023-05-28"),
        # A duration up to the time said (present perfect): when it began.
        ("I've had them for three years now.", "2020-01-01", "2020-12-31"),
        ("I've been volunteering there for about 2 years.", "2021-01-01", "2021-12-31"),
        ("It's been over two years since I moved.", "2021-01-01", "2021-12-31"),
        ("We have been married for 5 years!", "2018-01-01", "2018-12-31"),
        ("She's been with us for 2 months, and she's a delight.", "2023-03-01", "2023-03-31"),
        # ... without "for": in a present perfect, or opening a clause or a reply.
        ("We've been married 5 years now.", "2018-01-01", "2018-12-31"),
        ("Seven years now, and I've finally found my muse.", "2016-01-01", "2016-12-31"),
        ("5 years already! Time flies.", "2018-01-01", "2018-12-31"),
        ("Oh, about three years now!", "2020-01-01", "2020-12-31"),
        ("Melanie: Seven years now, and I love it.", "2016-01-01", "2016-12-31"),  # as stored
        # A season, the holidays, a weekday or a day of the month without last/next.
        ("I went there two summers ago.", "2021-06-01", "2021-08-31"),
        ("I went skiing a few winters ago.", "2019-12-01", "2022-02-28"),
        ("We hiked a lot over the summer.", "2022-06-01", "2022-08-31"),
        ("We're going to Spain over the summer.", "2023-06-01", "2023-08-31"),
        ("I saw my family over the holidays.", "2022-12-24", "2023-01-01"),
        ("I got this bike for Xmas.", "2022-12-25", "2022-12-25"),
        ("We met up two Fridays ago.", "2023-04-28", "2023-04-28"),
        ("I ran it the other week.", "2023-04-17", "2023-05-07"),
        ("We went there on the 3rd.", "2023-05-03", "2023-05-03"),
        ("I'll be there on the 12th.", "2023-05-12", "2023-05-12"),
        ("We went there on the 31st.", "2023-03-31", "2023-03-31"),  # April has no 31st
        # The United States' holidays on a weekday of their month; "some" as a vague count.
        ("We had a barbecue on Memorial Day.", "2022-05-30", "2022-05-30"),
        ("I'll call my mom on Mother's Day.", "2023-05-14", "2023-05-14"),
        ("We grilled on Labor Day.", "2022-09-05", "2022-09-05"),
        # A holiday's weekend: the days off it makes.
        ("We went there on Memorial Day weekend.", "2022-05-28", "2022-05-30"),
        ("I visited my folks over Thanksgiving weekend.", "2022-11-24", "2022-11-27"),
        ("We hid eggs over Easter weekend.", "2023-04-07", "2023-04-10"),
        ("I'll see him on Father's Day.", "2023-06-18", "2023-06-18"),
        ("We went out on St. Patrick's Day.", "2023-03-17", "2023-03-17"),
        ("Some months ago I started volunteering.", "2022-11-01", "2023-03-31"),
        ("I've been sick since Friday.", "2023-05-05", "2023-05-05"),
        # Dates in digits: ISO, and month/day or day/month where only one reading is a date.
        ("The race was on 2023-04-16.", "2023-04-16", "2023-04-16"),
        ("We left on 12/25/22.", "2022-12-25", "2022-12-25"),
        ("It's due by 14/05.", "2023-05-14", "2023-05-14"),
        # That very day, the weekday a week before the last one, a holiday so many years back.
        ("I quit two weeks ago today.", "2023-04-24", "2023-04-24"),
        ("We met a year ago today!", "2022-05-08", "2022-05-08"),
        ("I move out a month from today.", "2023-06-08", "2023-06-08"),
        ("I met her the Tuesday before last.", "2023-04-25", "2023-04-25"),
        # So long after a coming day: the coming Friday is 12 May.
        ("We leave a week from Friday.", "2023-05-19", "2023-05-19"),
        ("The wedding is a week from tomorrow!", "2023-05-16", "2023-05-16"),
        ("I fly out two weeks from Saturday.", "2023-05-27", "2023-05-27"),
        ("See you the Friday after next!", "2023-05-19", "2023-05-19"),
        ("We went there two Christmases ago.", "2021-12-25", "2021-12-25"),
        ("We moved three Thanksgivings ago.", "2020-11-26", "2020-11-26"),
        # A day of a week named, and a third of a week.
        ("I went on Friday last week.", "2023-05-05", "2023-05-05"),
        ("I'm going on Tuesday of next week.", "2023-05-16", "2023-05-16"),
        ("Last week on Wednesday we met.", "2023-05-03", "2023-05-03"),
        ("It was at the end of last week.", "2023-05-04", "2023-05-07"),
        ("We talked early last week.", "2023-05-01", "2023-05-03"),
        ("I'll be done by the end of the week.", "2023-05-11", "2023-05-14"),
        ("I went there earlier in the week.", "2023-05-08", "2023-05-08"),
        ("I'll get to it later in the month.", "2023-05-08", "2023-05-31"),
        ("We went hiking the past weekend.", "2023-05-06", "2023-05-07"),
        ("I slept badly the night before last.", "2023-05-06", "2023-05-06"),
        ("I met her Tuesday before last.", "2023-04-25", "2023-04-25"),
        ("We went to Italy the summer before last.", "2021-06-01", "2021-08-31"),
        ("The winter before last was cold.", "2021-12-01", "2022-02-28"),
        ("We went the fall before last.", "2021-09-01", "2021-11-30"),
        ("Christmas before last was rough.", "2021-12-25", "2021-12-25"),
        # The days from the time said on, in a sentence about what is to come.
        ("I'll finish it in the next two weeks.", "2023-05-09", "2023-05-22"),
        ("I'll be traveling in the coming weeks.", "2023-05-09", "2023-06-05"),
        ("I'm busy the next few days.", "2023-05-09", "2023-05-12"),
        # A day of the month in words, or of a month named relative to the time said.
        ("We met on the first of May.", "2023-05-01", "2023-05-01"),
        ("We met May first.", "2023-05-01", "2023-05-01"),
        ("We married on the twenty-first of April, 2022.", "2022-04-21", "2022-04-21"),
        ("I moved on June the 3rd.", "2022-06-03", "2022-06-03"),
        ("I moved on the 3rd of last month.", "2023-04-03", "2023-04-03"),
        ("I'll pay on the first of next month.", "2023-06-01", "2023-06-01"),
        ("It was the first of the month.", "2023-05-01", "2023-05-01"),
        # A weekday alone, in a sentence that tells or looks ahead (SAID is a Monday).
        ("We went hiking Saturday.", "2023-05-06", "2023-05-06"),
        ("Friday I finally finished it.", "2023-05-05", "2023-05-05"),
        ("See you Thursday!", "2023-05-11", "2023-05-11"),
        ("I'll pick you up Saturday 3pm.", "2023-05-13", "2023-05-13"),
        # "In the last month": the days just before, as "the past month" (not April).
        ("I lost weight in the last month.", "2023-04-07", "2023-05-07"),
        ("Over the last year I have grown.", "2022-05-08", "2023-05-07"),
        ("We hiked in the last week of April.", "2023-04-24", "2023-04-30"),  # a week of April
        # "this past June", "this coming June"; "this June" is of the year said.
        ("We got married this past June.", "2022-06-01", "2022-06-30"),
        ("We're getting married this coming June.", "2023-06-01", "2023-06-30"),
        ("We signed up for it this June.", "2023-06-01", "2023-06-30"),
        # A part of a season: its month, of the season the sentence points to.
        ("At the end of the summer we moved.", "2022-08-01", "2022-08-31"),
        ("I'll move at the end of the summer.", "2023-08-01", "2023-08-31"),
        ("In the middle of the winter it snowed.", "2023-01-01", "2023-01-31"),
        ("We married in early summer 2021.", "2021-06-01", "2021-06-30"),
        # A year written short: of the century the sentence's tense points to.
        ("We went to Japan back in '19.", "2019-01-01", "2019-12-31"),
        ("She was born in '95.", "1995-01-01", "1995-12-31"),
        ("I'll graduate in '25.", "2025-01-01", "2025-12-31"),
        # A range of dates is one span, its ends completing each other.
        ("I worked there from June to August 2022.", "2022-06-01", "2022-08-31"),
        ("We traveled between March and April.", "2023-03-01", "2023-04-30"),
        ("I'll travel from June to August.", "2023-06-01", "2023-08-31"),
        ("I lived there from December to February 2023.", "2022-12-01", "2023-02-28"),
        ("We were away from 3 to 10 May 2023.", "2023-05-03", "2023-05-10"),
        ("We were away between May 3 and May 10, 2023.", "2023-05-03", "2023-05-10"),
        ("I stayed from May 31 to June 2, 2022.", "2022-05-31", "2022-06-02"),
        ("I lived in Boston from 2010 to 2015.", "2010-01-01", "2015-12-31"),
        ("I studied there from 2019 until March 2021.", "2019-01-01", "2021-03-31"),
        ("We camped from early May to mid-June 2022.", "2022-05-01", "2022-06-20"),
    ],
)
def test_each_relative_form_resolves_against_the_session_date(
    text: str, start: str, end: str
) -> None:
    spans = resolve(text, SAID)
    assert len(spans) == 1, spans
    assert (spans[0].start.isoformat(), spans[0].end.isoformat()) == (start, end)


@pytest.mark.parametrize(
    "text",
    [
        "The day I was born was rainy.",  # a day, anchored on an event we cannot date
        "We had a week of rain.",  # a duration
        "I'll be away for 3 years.",  # a duration, not up to the time said
        "I had a fever for 3 days.",  # ... over in the past
        "I have to leave for two weeks.",  # ... "have to" is not a perfect
        "We took a course for 3 years.",  # ... past, no perfect in the clause
        "We stayed there for about two weeks.",  # ... hedged, still no perfect in the clause
        "The week prior to the move was hectic.",  # relative to an event
        "The previous week of the trip was the best.",  # a week of the trip, not before the session
        "I've seen it. We stayed for 2 weeks.",  # ... the perfect is in another sentence
        "The week before the wedding was chaos.",  # relative to an event, not to the session
        "The summer before the move we went to Italy.",  # ... a season before an event
        "Prices fall before last call.",  # "fall" a verb: no "the" before it
        "It takes a week from Friday to Friday.",  # a length between two days, not a day
        "Two days from Monday's deadline, I quit.",  # counted from an event, not from the day
        "The next two weeks were hard.",  # after some past event, not after the time said
        "It was a Thanksgiving weekend to remember.",  # a kind of weekend, of no year said
        "The next day we went home.",  # ... a day after an event
        "The next few weeks of school will be tough.",  # weeks of something else
        "Last time we talked you were moving.",  # last + a noun
        "What's your next step?",  # next + a noun
        "I may go there, march on!",  # "may" and "march" the verbs
        "May I ask you something?",  # a capital at the start of a question
        "I met Jan 5 times.",  # a name, not January
        "I spent a few days back home.",  # "back" as a place, not "ago"
        "We play chess on Fridays.",  # a habit, not one Friday
        "I love hiking on weekends.",  # ... nor one weekend
        "We put up the Christmas tree.",  # a holiday as a kind of thing
        "My Halloween costume is ready.",  # ... likewise
        "I lost 5 pounds in two weeks.",  # a length of time in the past
        "We haven't talked in a few days.",  # ... up to now
        "Rome wasn't built in a day.",  # ... a saying
        "The last two weeks of the trip were the best.",  # relative to an event
        "At the end of the day it's your call.",  # an idiom, not a date
        "We play cards every Friday night.",  # a habit
        "Friday nights are for pizza.",  # ... likewise
        "I swim on Monday mornings.",  # ... likewise
        "It was a quiet friday night kind of song.",  # a kind of evening (no capital)
        "I've been two years younger since the diet, ha.",  # "since" not after the length
        "She has been 3 years sober.",  # a length, no "since"
        "The course takes 2 years now, it used to be 3.",  # a length, in no perfect
        "I have to wait 2 weeks now.",  # ... "have to" is not a perfect
        "Ann: I will wait 5 years now.",  # ... a label opens the line, not the duration
        "We want 3 kids already, ha.",  # a count of no unit of time
        "I swim in the summer.",  # a habit, not one summer
        "I'm off work in the winter.",  # ... likewise
        "We visit them over the summer months.",  # ... and months of any summer
        "I live on the 3rd floor.",  # an ordinal, not a day
        "Rent is due on the 1st.",  # a habit: every month's first
        "Merry xmas!",  # a holiday as a greeting (no last/next or preposition)
        "I work 24/7 these days.",  # digits and a slash with no preposition nor year
        "I'd rate it 3/5 stars.",  # ... a rating
        "We met on 9/11.",  # either reading is a date: left
        "Version 2023-13-45 is out.",  # no such month
        "Over the last 0 days nothing changed.",  # no days at all (once a span that ran backward)
        "We fight like it's two Christmases in one.",  # no "ago": no holiday of any year
        "The Tuesday before the move was hectic.",  # relative to an event
        "Saturday is my day off.",  # a weekday in the present tense: any such day
        "I always ran Sunday mornings and Sunday.",  # ... in a habit
        "Black Friday was chaos.",  # a name, not a weekday
        "It was a Sunday like any other.",  # a kind of day
        "We went to Sunday school.",  # ... likewise
        "My cat is called Friday.",  # a name
        "We met Friday the 13th.",  # the date names the day (and is not read alone)
        "friday was fun",  # no capital: as "a friday night", a kind of day
        "Rent is due on the first of the month.",  # a habit: every month's first
        "It was the first of many.",  # an ordinal of no month
        "We met the second of the twins.",  # ... likewise
        "We danced to music from the '80s.",  # a decade, not a year
        "Rock 'n' roll in '60s.",  # ... likewise
        "I swim in late summer.",  # a habit: any year's
        "Late summer is my favourite.",  # ... likewise
        "The class grew from 3 to 10 people.",  # numbers, not days
        "Kids between 20 and 30 months old.",  # ... likewise
        "The score went from 2 to 12.",  # ... likewise
        "Prices may rise from may to june.",  # "may" as a verb: no month, no range
        "I slept two nights in a tent.",  # nights, but not before the time said
    ],
)
def test_look_alikes_do_not_resolve(text: str) -> None:
    assert resolve(text, SAID) == []


def test_a_day_counted_back_or_named_in_a_week_is_one_day_only_where_the_words_say_so() -> None:
    # A vague count names no one day: its weeks, and the day said, stay apart.
    vague = resolve("We started a few weeks ago today, I think.", SAID)
    assert [(s.phrase, s.grain) for s in vague] == [("a few weeks ago", "weeks"), ("today", "day")]
    # A comma ends the weekday's phrase: the last Friday, and last week as a whole.
    apart = resolve("I work on Friday, last week was busy.", SAID)
    assert [s.phrase for s in apart] == ["on Friday", "last week"]
    assert apart[1].days == 7
    # Said on a Saturday, "on Friday last week" is not the day before.
    saturday = date(2023, 5, 13)
    assert resolve("I went on Friday last week.", saturday)[0].start == date(2023, 5, 5)
    assert resolve("I went on Friday.", saturday)[0].start == date(2023, 5, 12)
    # A weekday with its date is read by the date alone.
    assert [s.phrase for s in resolve("I went Friday, May 5, with Ann.", saturday)] == ["May 5"]
    # "first" after "in June" is an adverb: the month alone.
    assert [s.phrase for s in resolve("We went to Spain in June first, then Italy.", SAID)] == [
        "in June"
    ]
    # A day the month does not have is no day (the month named stays).
    assert [s.phrase for s in resolve("I moved on the 31st of last month.", SAID)] == ["last month"]


def test_the_weekend_and_weekday_forms_follow_the_day_they_were_said() -> None:
    sunday = date(2023, 5, 14)
    # Said on a Sunday, "last weekend" is the one before (this one is not over).
    assert resolve("last weekend", sunday)[0].start == date(2023, 5, 6)
    assert resolve("this weekend", sunday)[0].start == date(2023, 5, 13)
    # "last Friday" said on a Friday is a week back, not the same day.
    assert resolve("last Friday", date(2023, 5, 12))[0].start == date(2023, 5, 5)


@pytest.mark.parametrize(
    ("text", "said", "day"),
    [
        ("I'll see her on Friday.", SAID, date(2023, 5, 12)),
        ("I saw her on Friday.", SAID, date(2023, 5, 5)),
        ("We're going to camp over the weekend.", SAID, date(2023, 5, 13)),
        # The tense is read per sentence: the future of the next one does not move this one.
        ("I saw her on Friday. I'll call her.", SAID, date(2023, 5, 5)),
        # "Will" inside a sentence is a name; opening a question it asks about the future.
        ("I saw Will on Friday.", SAID, date(2023, 5, 5)),
        ("Will you come on Friday?", SAID, date(2023, 5, 12)),
        ("We'll bake for Christmas!", SAID, date(2023, 12, 25)),
        # Said on a Monday, "this weekend" is the one just over, or the coming one in a sentence
        # about what is to come (or in the present tense).
        ("I went hiking this weekend.", SAID, date(2023, 5, 6)),
        ("We're going camping this weekend.", SAID, date(2023, 5, 13)),
        # "plans for" asks about what is to come; "for the weekend" alone tells what was.
        ("Any plans for the weekend?", SAID, date(2023, 5, 13)),
        ("I went home for the weekend.", SAID, date(2023, 5, 6)),
        # "last Monday night" stays last Monday, not the bare "Monday night".
        ("I saw it last Monday night.", SAID, date(2023, 5, 1)),
        # Said on a Sunday, "over the weekend" is the weekend now ending.
        ("I painted over the weekend.", date(2023, 5, 14), date(2023, 5, 13)),
        # The present tells what is planned: the coming day ...
        ("My recital is on Saturday, so nervous!", SAID, date(2023, 5, 13)),
        ("I'm seeing her on Friday.", SAID, date(2023, 5, 12)),
        ("We have a game on Sunday.", SAID, date(2023, 5, 14)),
        ("Are you free on Friday?", SAID, date(2023, 5, 12)),
        ("I'm getting a bike for Christmas.", SAID, date(2023, 12, 25)),
        # ... unless the sentence tells what happened, or a habit.
        ("I'm so tired, we partied on Friday.", SAID, date(2023, 5, 5)),
        ("It was fun on Friday.", SAID, date(2023, 5, 5)),
        ("I'm usually at my mom's on Friday.", SAID, date(2023, 5, 5)),
        # A timetable's verbs in the simple present plan too, and the tense is read per clause:
        # what the first clause tells does not move the second's day ...
        ("Oren found a flat and I start at the aquarium on Monday.", SAID, date(2023, 5, 15)),
        ("The shop opens on Saturday.", SAID, date(2023, 5, 13)),
        ("Sam got the keys, so we're moving in on Friday!", SAID, date(2023, 5, 12)),
        # ... nor the other way round; an "and" inside a name or between two subjects is no
        # clause of its own, and a timetable's verb told in the past or as a habit stays past.
        ("We partied on Friday and I'm so tired.", SAID, date(2023, 5, 5)),
        ("We went to Tom and Jerry's on Friday.", SAID, date(2023, 5, 5)),
        ("My mom and I went to the zoo on Friday.", SAID, date(2023, 5, 5)),
        ("I started on Friday.", SAID, date(2023, 5, 5)),
        ("I usually leave on Friday.", SAID, date(2023, 5, 5)),
    ],
)
def test_a_bare_day_is_the_coming_one_in_a_sentence_about_the_future(
    text: str, said: date, day: date
) -> None:
    # SAID is a Monday.
    assert resolve(text, said)[0].start == day


def test_unix_time_is_a_date_as_sillytavern_reads_it() -> None:
    # SillyTavern's older chats store send_date as Unix time in milliseconds; its own parser
    # (parseTimestamp) reads a string of digits so too.
    assert parse_when("1683554160000") == date(2023, 5, 8)
    assert parse_when("1683554160") == date(2023, 5, 8)
    assert parse_when("2023-5-8 @13h 56m 0s 123ms") == date(2023, 5, 8)  # its "humanized" form
    assert parse_when("12345") is None  # a number, not a time


def test_a_time_zone_dateutil_does_not_know_is_read_past_without_a_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dateutil warns now and will raise later
        assert parse_when("1:56 pm on 8 May, 2023 AZ") == date(2023, 5, 8)
        assert parse_when("2023-05-08T23:30:00-05:00") == date(2023, 5, 8)  # the day as written


def test_without_a_session_date_nothing_resolves() -> None:
    assert parse_when("chapter 3") is None  # no year: dateutil would invent today's
    assert resolve("yesterday", parse_when("")) == []


def test_questions_name_absolute_dates_only_and_when_questions_are_told_apart() -> None:
    (day,) = query_dates("Who did Maria have dinner with on May 3, 2023?")
    assert (
        day.span is not None and day.span.start == day.span.end == date(2023, 5, 3) and day.precise
    )
    (worded,) = query_dates("What did Ann do on the first of May, 2023?")
    assert worded.span is not None and worded.span.start == worded.span.end == date(2023, 5, 1)
    (month,) = query_dates("Which outdoor spot did Joanna visit in May?")
    assert month.span is None and month.month == 5 and not month.precise
    (summer,) = query_dates("Where did John travel in the summer of 2022?")
    assert (
        summer.span is not None
        and summer.span.start == date(2022, 6, 1)
        and summer.precise is False
    )
    (early,) = query_dates("What did Nate buy in early 2022?")
    assert early.span is not None and (early.span.start, early.span.end) == (
        date(2022, 1, 1),
        date(2022, 4, 30),
    )
    (year,) = query_dates("What did Melanie paint in 2022?")
    assert year.span is not None and year.span.days == 365 and not year.precise
    assert (
        query_dates("What did she do last week, maybe?") == []
    )  # relative, no anchor in a question
    assert asks_when("When did Caroline go to the support group?")
    assert asks_when("In what year did John get his dog?")
    assert asks_when("In which month did they move?")
    assert asks_when("How many weeks passed between Maria adopting Coco and Shadow?")
    assert asks_when("Since when has she painted?")
    week = query_dates("What did she do in the second week of May 2023?")
    assert [(d.span.start, d.span.end) for d in week if d.span] == [
        (date(2023, 5, 8), date(2023, 5, 14))
    ]
    assert asks_when("Around when did Nate adopt his dog?")
    assert not asks_when("What did they talk about when they met?")  # "about when" mid-question
    assert not asks_when("What did Caroline do when she got home?")  # "when" not asking for a time
    assert not asks_when("How many books did Melanie read?")  # a count, not a time
    assert asks_when("Around what time of year did they go camping?")
    assert asks_when("At what point did Jon quit his job?")
    assert asks_when("What was the date of Joanna's premiere?")
    assert asks_when("Was it before or after the wedding that they moved?")
    assert not asks_when("At what price did Gina sell the dress?")  # a price, not a time
    assert not asks_when("What was the name of the movie?")  # a name, not a date
    assert not asks_when("What did Melanie do after the accident?")  # "after" alone orders nothing
    assert asks_when("Around which US holiday did Maria get into a car accident?")
    assert asks_when("Which holiday did Jon spend with his family?")
    assert not asks_when("What holiday traditions does Maria have?")  # a kind of tradition


def test_a_range_a_question_names_is_its_span_or_each_month_it_runs_over() -> None:
    (span,) = query_dates("What did Caroline do between May and July 2023?")
    assert span.span is not None and (span.span.start, span.span.end) == (
        date(2023, 5, 1),
        date(2023, 7, 31),
    )
    (days,) = query_dates("Where was Nate from 3 to 10 May 2023?")
    assert days.span is not None and (days.span.start, days.span.end) == (
        date(2023, 5, 3),
        date(2023, 5, 10),
    )
    # No year: the months of any year, across the new year too.
    assert [d.month for d in query_dates("Where did Jon travel between March and May?")] == [
        3,
        4,
        5,
    ]
    assert [d.month for d in query_dates("What did Gina do from December to February?")] == [
        12,
        1,
        2,
    ]
    # Look-alikes: the months alone as before; numbers that are no dates name none.
    assert [d.month for d in query_dates("What did Jon do in March and in May?")] == [3, 5]
    assert query_dates("How many came, from 3 to 10?") == []
    # A month named relative to the time said has no anchor in a question.
    assert query_dates("What did Jon do this past June?") == []
    assert query_dates("What did Jon do this June?") == []


def test_a_holiday_a_question_names_is_its_day_in_any_year() -> None:
    (thanksgiving,) = query_dates("What did Jon do on Thanksgiving?")
    assert thanksgiving.matches(TimeSpan(date(2022, 11, 24), date(2022, 11, 24)))
    assert thanksgiving.contains(TimeSpan(date(2023, 11, 23), date(2023, 11, 23)))
    # Look-alikes: the day before it, a week that holds it (matched, not contained), a
    # holiday after which something happened, one "last" (relative: no anchor in a question).
    assert not thanksgiving.matches(TimeSpan(date(2023, 11, 22), date(2023, 11, 22)))
    week = TimeSpan(date(2022, 11, 20), date(2022, 11, 26))
    assert thanksgiving.matches(week) and not thanksgiving.contains(week)
    assert query_dates("What did Jon do after Christmas?") == []
    assert query_dates("What did Jon do last Christmas?") == []


def test_a_choice_between_two_events_by_their_order_is_a_when_question_with_both_events() -> None:
    assert order_choice("Which came first, the yoga class or the marathon?") == (
        "the yoga class",
        "the marathon",
    )
    assert order_choice("What happened first: Nate's win or his move?") == (
        "Nate's win",
        "his move",
    )
    assert order_choice("Did Jon open his studio or lose his job first?") == (
        "Jon open his studio",
        "lose his job",
    )
    assert asks_when("Which event happened earlier, the bake sale or the fundraiser?")
    # Look-alikes: a choice the order word does not govern, a choice of anything but events'
    # order, an order asked with no choice, a wish about what comes first.
    for question in (
        "Who won first place, Jon or Gina?",
        "Which do you prefer, tea or coffee?",
        "Which came first?",
        "What did you do first, after the move?",
        "Do you want tea or coffee first?",
    ):
        assert order_choice(question) is None and not asks_when(question), question


@pytest.mark.parametrize(
    ("text", "described"),
    [
        ("I went to the support group yesterday.", "yesterday = Sunday 7 May 2023"),
        ("I joined a gym last week!", "last week = 1-7 May 2023"),
        ("We went camping two weekends ago.", "two weekends ago = 29-30 April 2023"),
        ("I'm starting a new job next month.", "next month = June 2023"),
        ("I first watched it around 3 years ago.", "3 years ago = 2020"),
        ("Last summer we saw the meteor shower.", "Last summer = June - August 2022"),
        ("We moved at the end of last year.", "the end of last year = September - December 2022"),
        ("We skied last winter.", "last winter = December 2022 - February 2023"),
        ("I've had them for three years now.", "for three years now = since 2020"),
    ],
)
def test_a_resolved_span_is_spelled_out_for_a_reader(text: str, described: str) -> None:
    assert [f"{span.phrase} = {span.describe()}" for span in resolve(text, SAID)] == [described]


@pytest.mark.parametrize(
    ("text", "described"),
    [
        # A month or day with the year named relative to the time said is one span: "in March"
        # alone would be the nearest March (2023), the wrong year for the packet to spell out.
        ("We went to Paris in March last year.", "in March last year = March 2022"),
        ("Last year in March we moved.", "Last year in March = March 2022"),
        ("It was 3 July last year, I think.", "3 July last year = Sunday 3 July 2022"),
        ("I graduate on May 3rd of next year.", "on May 3rd of next year = Friday 3 May 2024"),
        ("Next year, in early June, we marry.", "Next year, in early June = 1-10 June 2024"),
        ("I started early June this year.", "early June this year = 1-10 June 2023"),
        ("In the spring of last year we moved.", "spring of last year = March - May 2022"),
        ("I got it at the end of 2021.", "the end of 2021 = September - December 2021"),
        # Look-alikes: "may" and "march" as verbs leave "last year" alone, and a comma after the
        # month ends its phrase ("last year" is the next clause's subject).
        ("I may last year have said so.", "last year = 2022"),
        ("In March, last year felt long.", "In March = March 2023"),
    ],
)
def test_a_month_or_season_of_a_year_named_relative_to_the_time_said_is_that_year(
    text: str, described: str
) -> None:
    assert [f"{span.phrase} = {span.describe()}" for span in resolve(text, SAID)][0] == described


#: The words time expressions are made of, and some that are not: sentences drawn from them
#: reach the resolver's corners (a month 0, the 29th of February, a count with no unit).
_FUZZ_WORDS = (
    "on by since until the of last next this past coming ago back for in over during around "
    "a few couple some several two 3 12 0 31 29 2/29 14/05 5/14 0/15 12/32 2023-02-29 "
    "2023-13-01 2022 1999 May June february day days week weekend weekends month months year "
    "years decade summer winter holidays Christmas Thanksgiving Easter Memorial Labor Day "
    "Mother's Friday Fridays morning night yesterday tomorrow today early mid late end "
    "beginning start first second last half and or I we went will be been have had , . ? ! "
    "earlier later Saturday Tuesday Christmases today from before coming Easter weekend "
    "between to until through - 10th within '19 '80s"
).split()


def test_the_resolver_never_fails_and_every_span_runs_forward() -> None:
    import random

    draw = random.Random(20261130)
    anchors = [date(2023, 5, 8), date(2024, 2, 29), date(2023, 12, 31), date(2000, 1, 1)]
    for _ in range(3000):
        text = " ".join(draw.choices(_FUZZ_WORDS, k=draw.randint(1, 12)))
        for span in resolve(text, draw.choice(anchors)):
            assert span.start <= span.end, (text, span)
        for named in query_dates(text):
            assert named.span is None or named.span.start <= named.span.end, (text, named)
        asks_when(text)
    # Said on a Wednesday, the weekend of "earlier this weekend" is still to come: no days.
    for text in ("I ran earlier this weekend.", "I ran earlier in the weekend."):
        assert resolve(text, date(2023, 5, 10)) == [], text
    assert resolve("I ran earlier in the weekend.", date(2023, 5, 14))[0].start == date(2023, 5, 13)


@pytest.mark.parametrize(
    ("text", "deictic"),
    [
        ("What did you do yesterday?", ["yesterday = Sunday 7 May 2023"]),
        ("Where were you last Saturday?", ["last Saturday = Saturday 6 May 2023"]),
        ("What did we talk about this morning?", ["this morning = Monday 8 May 2023"]),
        ("What happened two weeks ago?", ["two weeks ago = 24-30 April 2023"]),
        # Look-alikes: a calendar date and a duration say the same on any day.
        ("What did you do on 3 May 2023?", []),
        ("What did you do in May?", []),
        ("Which dog have you had for three years?", []),
    ],
)
def test_deictic_dates_are_the_ones_named_through_the_day_asked(
    text: str, deictic: list[str]
) -> None:
    assert [f"{s.phrase} = {s.describe()}" for s in deictic_dates(text, SAID)] == deictic
    assert deictic_dates(text, None) == []
