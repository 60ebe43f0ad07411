"""The fusion's constants: the learned model's features and weights (`FEATURES`,
`LearnedFusion`, `LEARNED_FUSION`) and the reciprocal-rank fusion's knobs (`RecallParams`),
with the values in use in `DEFAULT_PARAMS`.

Contract: every value here is chosen by `python -m bench.recall_protocol` (leave one shared
dialogue out); a change to one is a change to the recall figures and is re-measured there.
Which folds chose each value, and what they measured: docs/decisions/recall-fusion.md.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: What the learned fusion weighs for each candidate document (`HybridIndex.features`): the
#: reciprocal rank in each ranker at two depths (lexical; dense with the query's vector; dense
#: with its plain vector: conversation turns are asked with one vector, of the query without
#: the speakers' names, so for them the two dense columns are one ranking and the fit splits
#: its weight between them), the cosines themselves, the
#: best of the in-group neighbours (lexical rank, cosine), the group's best match (session
#: relevance), whether the document's speaker is the one the query names or the other one,
#: a date the query names matched by the document's own date or by one it speaks of, a
#: when-question and a document that speaks of a time, an image caption, the text's length
#: (log characters) and the reciprocal-rank fusion of lexical and dense (`rrf`). The graph's
#: links are added apart (`core.recall.fusion.learned_rank`): no shared dialogue has facts to
#: fit them.
FEATURES = (
    "lexical_10",
    "lexical_60",
    "dense_10",
    "dense_60",
    "plain_10",
    "plain_60",
    "cosine",
    "plain_cosine",
    "neighbour_lexical",
    "neighbour_plain_cosine",
    "session",
    "speaker",
    "other_speaker",
    "date",
    "event_date",
    "when",
    "caption",
    "length",
    "question_share",
    "rrf",
)


class LearnedFusion(BaseModel):
    """A logistic model over `FEATURES`: a document's score is `bias + weights . features`
    (the log-odds that it is evidence for the query). Fitted by `python -m bench.recall_protocol`
    on the training dialogues of each fold; the weights in use are the mean of the four folds'."""

    model_config = ConfigDict(frozen=True)

    weights: tuple[float, ...] = Field(description="one per FEATURES, on the features' own scale")
    bias: float = 0.0


class RecallParams(BaseModel):
    """The fusion's constants. `DEFAULT_PARAMS` holds the values in use, each chosen by the
    leave-one-dialogue-out protocol (`python -m bench.recall_protocol`): every shared LoCoMo
    dialogue is held out once, the three others tune the constants (recall@10, categories 1-4,
    a knob moves only for a gain of at least the bench's MIN_GAIN), and the value kept is the
    one most of the four folds chose (a tie goes to the value nearer the reference, the
    constant before the protocol). The folds' choices: docs/decisions/recall-fusion.md."""

    model_config = ConfigDict(frozen=True)

    #: The unit of the fusion: not tuned.
    lexical_weight: float = Field(1.0, ge=0, description="RRF weight of BM25")
    dense_weight: float = Field(0.5, ge=0, description="RRF weight of the sentence embeddings")
    rrf_k: int = Field(60, ge=1, description="RRF's k: lower trusts the top ranks more")
    neighbour_share: float = Field(
        0.2, ge=0, description="share of a hit's score its group neighbours gain"
    )
    entity_boost: float = Field(
        0.3, ge=0, description="documents of the one speaker the query names"
    )
    date_boost: float = Field(
        0.1, ge=0, description="the document's own date matches a date the query names"
    )
    event_boost: float = Field(
        0.0, ge=0, description="a date the document speaks of lies within one the query names"
    )
    when_boost: float = Field(
        0.0, ge=0, description="a when-question, and the document speaks of a time"
    )
    session_share: float = Field(
        0.2, ge=0, description="share of its group's best score a document gains"
    )
    #: Not tuned by the protocol (the LoCoMo runs have no extracted facts): the weight the
    #: dense ranker has, a ranker of its own.
    linked_weight: float = Field(
        0.5, ge=0, description="RRF weight of documents the graph's facts link to the query"
    )
    #: Two-event questions (`query_parts`): how many of each part's own best documents are
    #: kept in the top PART_WINDOW (0: the parts are not asked, nor embedded). On by design
    #: (issue #34: a slot for each event), not tuned: held out on the shared dialogues it moves
    #: nothing (docs/decisions/recall-fusion.md, "Two-event questions").
    part_budget: int = Field(
        1, ge=0, le=3, description="slots per part of a two-event question in the top 10"
    )
    #: Of how many of a part's own best documents its slots are filled (the ones the whole
    #: question ranks highest; 1: the part's own best; unused at part_budget 0).
    part_depth: int = Field(
        10, ge=1, le=100, description="a part's slots are filled from its best part_depth"
    )
    #: The fusion of conversation turns (indexes with neighbours): a learned model over FEATURES
    #: instead of the reciprocal-rank fusion and its boosts above (which then only shape its
    #: `rrf` feature). None: reciprocal-rank fusion with the boosts. Scenes always use the RRF.
    fusion: LearnedFusion | None = Field(None, description="learned fusion of conversation turns")


#: The learned fusion in use: the mean of the four folds' fits (`python -m bench.recall_protocol`,
#: each fold fitted on the three dialogues it did not hold out). What it learned and what it
#: measured: docs/decisions/recall-fusion.md.
LEARNED_FUSION = LearnedFusion(
    weights=(
        50.8476,
        -67.5036,
        21.0051,
        30.3079,
        21.0051,
        30.3079,
        -0.9416,
        -0.9416,
        70.738,
        2.2556,
        61.834,
        -0.1887,
        -3.2412,
        1.1255,
        1.2518,
        0.8497,
        0.3713,
        0.33,
        -2.0144,
        -37.0886,
    ),
    bias=-5.0997,
)
#: The constants in use (see RecallParams).
DEFAULT_PARAMS = RecallParams(fusion=LEARNED_FUSION)
#: Candidates each ranker hands to the fusion.
CANDIDATES = 100
#: The longest span a question's "yesterday"-like date may name for the turns said in it to be
#: candidates of their own (`Prepared.dated`): a month, as `QueryDate.precise`.
DATED_SPAN_DAYS = 31
#: The share of the top window (`PART_WINDOW`, or the first k when fewer) kept for the turns of
#: a day a chat question names through its own ("yesterday"): half, so the day's turns are there
#: and the question's other strong matches too. Not fitted: no shared dialogue asks on a day.
ASKED_DAY_SHARE = 0.5

#: The signal name each learned feature's term is reported under (`Hit.signals`).
SIGNAL_OF = {
    "lexical_10": "lexical",
    "lexical_60": "lexical",
    "dense_10": "dense",
    "dense_60": "dense",
    "cosine": "dense",
    "plain_10": "plain",
    "plain_60": "plain",
    "plain_cosine": "plain",
    "neighbour_lexical": "neighbour",
    "neighbour_plain_cosine": "neighbour",
    "session": "session",
    "speaker": "graph",
    "other_speaker": "graph",
    "date": "time",
    "event_date": "event_time",
    "when": "when",
    "caption": "caption",
    "length": "length",
    "question_share": "question",
    "rrf": "rrf",
}
