"""Names as healing compares them: canonical tokens (titles dropped, nicknames mapped to the
formal first name), the token match kinds, and a phonetic key for blocking.

`soundex` is written out (15 lines) rather than taken from jellyfish: it is only a blocking
key, letters a-z only, and a compiled dependency for it would weigh more than the code.
String similarity is the standard library's difflib."""

from __future__ import annotations

from difflib import SequenceMatcher

from kg import vocabulary as vocab
from kg.healing.models import NameMatch

#: Score of "one name's tokens are a subset of the other's" (John / John Smith): above the
#: default name threshold, so containment alone passes the name test and evidence decides.
CONTAINMENT_SCORE = 0.9

#: Honorifics dropped from character names before comparing ("Dr. William Turner").
TITLES = frozenset(
    "dr doctor mr mrs ms miss mx sir dame lady lord master mistress madam madame prof professor "
    "capt captain col colonel gen general lt lieutenant sgt sergeant rev reverend father sister "
    "brother aunt uncle king queen prince princess duke duchess count countess baron baroness".split()
)
#: Nickname -> formal first name (a small, common English table; extend as needed).
NICKNAMES: dict[str, str] = {
    nick: formal
    for formal, nicks in {
        "john": "johnny jack jackie jon jonny",
        "william": "bill billy will willy willie liam",
        "elizabeth": "liz lizzie lizzy beth betty eliza libby bess",
        "robert": "bob bobby rob robbie bert",
        "katherine": "kate katie kathy cathy kat kitty",
        "thomas": "tom tommy",
        "michael": "mike mikey mick mickey",
        "james": "jim jimmy jamie",
        "richard": "dick rick ricky rich richie",
        "margaret": "maggie meg peggy peg marge greta",
        "samuel": "sam sammy",
        "alexander": "alex sandy xander",
        "benjamin": "ben benny",
        "daniel": "dan danny",
        "edward": "ed eddie ted teddy ned",
        "henry": "harry hal hank",
        "nicholas": "nick nicky",
        "anthony": "tony",
        "christopher": "chris kit",
        "joseph": "joe joey",
        "susan": "sue susie suzy",
        "anna": "annie",
        "charles": "charlie chuck",
        "patricia": "pat patty tricia",
        "jennifer": "jen jenny",
        "victoria": "vicky tori",
        "theodore": "theo",
        "matthew": "matt",
        "andrew": "andy drew",
        "david": "dave davy",
        "stephen": "steve stevie",
        "rebecca": "becky becca",
        "abigail": "abby",
        "eleanor": "ellie nell nora",
        "frederick": "fred freddie",
        "isabella": "bella izzy",
        "josephine": "josie jo",
        "lawrence": "larry",
        "leonard": "leo len lenny",
        "peter": "pete",
        "timothy": "tim timmy",
    }.items()
    for nick in nicks.split()
}


def canonical_tokens(name: str, label: str, *, nicknames: bool = True) -> tuple[str, ...]:
    """Normalised name tokens; for characters without titles and with nicknames mapped."""
    tokens = vocab.normalize_name(name).split()
    if label == "Character":
        tokens = [t for t in tokens if t not in TITLES] or tokens
        if nicknames:
            tokens = [NICKNAMES.get(t, t) for t in tokens]
    return tuple(tokens)


def token_match(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[float, NameMatch]:
    """(similarity, kind): the same canonical tokens, one name inside the other, or only
    similar strings (difflib ratio: typos, but also "Salt Hill" / "Salt Mill")."""
    if not a or not b:
        return 0.0, "similar"
    if a == b or sorted(a) == sorted(b):
        return 1.0, "same"
    sa, sb = set(a), set(b)
    if sa < sb or sb < sa:
        return CONTAINMENT_SCORE, "contained"
    return SequenceMatcher(None, " ".join(a), " ".join(b), autojunk=False).ratio(), "similar"


def token_similarity(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    return token_match(a, b)[0]


def soundex(token: str) -> str:
    """American Soundex of one token (letters only): a typo-tolerant block key."""
    codes = {
        **dict.fromkeys("bfpv", "1"),
        **dict.fromkeys("cgjkqsxz", "2"),
        **dict.fromkeys("dt", "3"),
        "l": "4",
        **dict.fromkeys("mn", "5"),
        "r": "6",
    }
    letters = [c for c in token if "a" <= c <= "z"]
    if not letters:
        return token
    out, last = letters[0].upper(), codes.get(letters[0], "")
    for c in letters[1:]:
        code = codes.get(c, "")
        if code and code != last:
            out += code
        if c not in "hw":
            last = code
    return (out + "000")[:4]
