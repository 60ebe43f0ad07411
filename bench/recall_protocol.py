"""Leave-one-dialogue-out protocol for the recall fusion: tune on some dialogues, report on another.

    python -m bench.recall_protocol [--dialogues DIR] [--cache DIR] [--json FILE] [--embedder NAME]

Every shared dialogue (../shared/data/dialogues, four LoCoMo conversations) is held out once.
A fold tunes the fusion's constants (`core.recall.RecallParams`) on the other dialogues and
is measured on the one held out: recall@10 and recall@5 over the questions of categories 1-4
that have evidence, each question as `flows.regression --mode ingest` asks it (the same
memory rows, the same index, the same embeddings: core.embedder, no LLM). The output shows,
per fold, what it chose, its tuned-on figure (the training dialogues) beside its held-out
one, per category; then the mean and the spread over folds, which folds chose each value
(docs/decisions/recall-fusion.md quotes them), the defaults measured on every
dialogue (tuned on all, so not a held-out figure), and the alternatives that were measured
and not adopted, each under the same protocol. Two-event questions (`core.recall.query_parts`)
are asked as the product asks them (`core.recall.DEFAULT_PARAMS.part_budget`, on by design:
issue #34 asks for a slot per event); what each fold's training dialogues would choose among
`PART_BUDGETS` and `PART_DEPTHS`, and the held-out figures without the parts and with each
setting always on, are printed beside it.

Tuning is coordinate ascent over a small grid (`KNOBS`), from the reference values (the
constants before the protocol existed), two passes: a knob moves only for a gain of at least
`MIN_GAIN` on the training dialogues, so noise-level gains do not move it. Embeddings are
computed once (about 30 s on 2 cores; `--cache DIR` keeps them between runs, keyed by the
model, the side (query or passage) and the texts), then every configuration is a fusion of cached candidates
(`HybridIndex.prepare` once per question, `HybridIndex.rank` per configuration).

`--embedder NAME` measures another embedding model (bench.embedders: each ships its weights
in a package) under the same protocol, the fusion refitted on the same folds: the turns are
embedded as passages, the questions and their parts as queries, each with the prefixes its
authors specify. The default is the product's (core.embedder).

`--evidence-audit DIR` also scores the learned fusion's folds against the evidence a published
audit of LoCoMo's answer key cites where the published evidence is wrong
(bench/evidence_audit.py): the fusion is fitted on the published evidence either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.embedders import CANDIDATES, DEFAULT
from bench.evidence_audit import AuditMatch, apply_audit
from bench.recall_folds import (
    ALTERNATIVES,
    CATEGORIES,
    KNOBS,
    MIN_GAIN,
    PART_BUDGETS,
    PART_DEPTHS,
    REFERENCE,
    Dialogue,
    add_dialogue_options,
    changed_knobs,
    consensus_value,
    dialogue_paths,
    fit_fusion,
    held_out_forced,
    held_out_with_choice,
    load,
    mean_fusion,
    part_budget_for,
    pooled,
    scores,
    short_name,
    tune,
    use_embedder,
)
from core.embedder import EmbedderUnavailableError
from core.errors import InvalidInputError
from core.recall import DEFAULT_PARAMS, FEATURES, LearnedFusion, RecallParams
from tasks.dialogue.evidence_audit import EvidenceAudit, read_audit

Fold = tuple[Dialogue, list[Dialogue], RecallParams]
Row = tuple[int, float, float]


def _summary(rows: list[dict[str, object]], every: list[Row], stdev: bool) -> dict[str, object]:
    """The folds' held-out and tuned-on means, and every question judged by its own fold
    (`stdev`: with the spread's standard deviation, as the reciprocal-rank comparison prints)."""
    held10 = [r["recall_at_10"] for r in rows]
    tuned10 = [r["tuned_on_recall_at_10"] for r in rows]
    summary: dict[str, object] = {
        "held_out_mean_recall_at_10": round(float(np.mean(held10)), 4),
        "held_out_spread_recall_at_10": [round(min(held10), 4), round(max(held10), 4)],
    }
    if stdev:
        summary["held_out_stdev_recall_at_10"] = (
            round(statistics.stdev(held10), 4) if len(held10) > 1 else 0.0
        )
    summary |= {
        "tuned_on_mean_recall_at_10": round(float(np.mean(tuned10)), 4),
        "held_out_mean_recall_at_5": round(float(np.mean([r["recall_at_5"] for r in rows])), 4),
        "tuned_on_mean_recall_at_5": round(
            float(np.mean([r["tuned_on_recall_at_5"] for r in rows])), 4
        ),
        "held_out_pooled_recall_at_10": round(pooled(every), 4),
        "held_out_pooled_categories": {str(c): round(pooled(every, 2, c), 4) for c in CATEGORIES},
    }
    return summary


def _print_summary(summary: dict[str, object], rows: list[dict[str, object]]) -> None:
    held10 = [r["recall_at_10"] for r in rows]
    stdev = (
        f", stdev {summary['held_out_stdev_recall_at_10']:.3f}"
        if "held_out_stdev_recall_at_10" in summary
        else ""
    )
    print(
        f"\nheld-out recall@10: mean {summary['held_out_mean_recall_at_10']:.3f} (folds "
        f"{min(held10):.3f}-{max(held10):.3f}{stdev}); "
        f"tuned-on mean {summary['tuned_on_mean_recall_at_10']:.3f}; gap "
        f"{summary['tuned_on_mean_recall_at_10'] - summary['held_out_mean_recall_at_10']:+.3f}"
    )
    print(
        f"held-out recall@5: mean {summary['held_out_mean_recall_at_5']:.3f}; tuned-on mean "
        f"{summary['tuned_on_mean_recall_at_5']:.3f}"
    )
    print(
        "held-out, every question judged by the fold that held it out: recall@10 "
        f"{summary['held_out_pooled_recall_at_10']:.3f} ("
        + ", ".join(f"c{c} {v:.3f}" for c, v in summary["held_out_pooled_categories"].items())
        + ")"
    )


def _fold_row(
    held_out: Dialogue,
    train: list[Dialogue],
    params: RecallParams,
    held: list[Row],
    key: str,
    chosen: object,
) -> dict[str, object]:
    """A fold's figures as printed and written: what it chose (`key`), tuned-on beside
    held-out recall, per category. The tuned-on recall@10 is what `tune` maximised."""
    tuned = [r for d in train for r in scores(d, params)]
    return {
        "held_out": held_out.name,
        "tuned_on": [d.name for d in train],
        key: chosen,
        "tuned_on_recall_at_10": round(pooled(tuned), 4),
        "tuned_on_recall_at_5": round(pooled(tuned, 1), 4),
        "recall_at_10": round(pooled(held), 4),
        "recall_at_5": round(pooled(held, 1), 4),
        "categories": {str(c): round(pooled(held, 2, c), 4) for c in CATEGORIES},
        "tuned_on_categories": {str(c): round(pooled(tuned, 2, c), 4) for c in CATEGORIES},
    }


#: Two-event questions as the product asks them: issue #34 asks for a slot per event, so
#: the parts are on by design (not tuned: no setting moves a training figure on the shared
#: dialogues, whose questions name two events 19 times in 580, so the folds choose none).
PRODUCT_PARTS = {
    "part_budget": DEFAULT_PARAMS.part_budget,
    "part_depth": DEFAULT_PARAMS.part_depth,
}


def _learned_fold(
    held_out: Dialogue, train: list[Dialogue]
) -> tuple[dict[str, object], LearnedFusion, list[Row], float, str]:
    """One fold of the learned fusion: its row (printed), its fit, its held-out rows, its
    held-out recall@10 without the parts, and the slots per part / depth its training
    dialogues would choose. The held-out figures ask the parts as the product does
    (`DEFAULT_PARAMS.part_budget`, a design choice: see `PRODUCT_PARTS`)."""
    fusion = fit_fusion(train)
    params = REFERENCE.model_copy(update={"fusion": fusion, **PRODUCT_PARTS})
    chosen = part_budget_for(train, params.model_copy(update={"part_budget": 0}))
    without_parts = pooled(scores(held_out, params.model_copy(update={"part_budget": 0})))
    budget = f"{chosen.part_budget}/{chosen.part_depth}" if chosen.part_budget else "0"
    held = scores(held_out, params)
    row = _fold_row(held_out, train, params, held, "fusion", fusion.model_dump())
    print(
        f"{held_out.name} | {'+'.join(short_name(d.name) for d in train)} | "
        f"{row['tuned_on_recall_at_10']:.3f} | "
        f"{row['recall_at_10']:.3f} | {row['recall_at_5']:.3f} | "
        + " | ".join(f"{row['categories'][str(c)]:.3f}" for c in CATEGORIES)
        + " | "
        + " | ".join(f"{row['tuned_on_categories'][str(c)]:.3f}" for c in CATEGORIES)
    )
    return row, fusion, held, without_parts, budget


def _parts_always_on(dialogues: list[Dialogue], fusions: list[LearnedFusion]) -> dict[str, float]:
    """Held-out mean recall@10 with each slots-per-part / depth setting forced on every fold."""
    forced_parts = {}
    for budget in PART_BUDGETS[1:]:
        for depth in PART_DEPTHS:
            update = {"part_budget": budget, "part_depth": depth}
            held = [
                pooled(scores(held_out, REFERENCE.model_copy(update={"fusion": fusion, **update})))
                for held_out, fusion in zip(dialogues, fusions, strict=True)
            ]
            forced_parts[f"{budget}/{depth}"] = round(float(np.mean(held)), 4)
    return forced_parts


def _print_fusions(dialogues: list[Dialogue], fusions: list[LearnedFusion]) -> LearnedFusion:
    """Each fold's weights, and their mean (what core.recall.LEARNED_FUSION should be)."""
    print("weights per fold (held out: " + ", ".join(short_name(d.name) for d in dialogues) + "):")
    for i, name in enumerate(FEATURES):
        print(f"  {name}: " + " ".join(f"{f.weights[i]:g}" for f in fusions))
    print("  bias: " + " ".join(f"{f.bias:g}" for f in fusions))
    consensus = mean_fusion(fusions)
    print(
        f"the folds' mean (core.recall.LEARNED_FUSION): weights={consensus.weights}, "
        f"bias={consensus.bias}"
    )
    if DEFAULT_PARAMS.fusion != consensus:
        print("  NOTE: core.recall.DEFAULT_PARAMS.fusion differs from it")
    return consensus


def _against_audit(
    dialogues: list[Dialogue], fusions: list[LearnedFusion], match: AuditMatch
) -> dict[str, object]:
    """Each fold's fusion (fitted on the published evidence) scored against the evidence an
    audit cites instead (bench.evidence_audit), held out and tuned on."""
    rows, every = [], []
    for held_out, fusion in zip(dialogues, fusions, strict=True):
        params = REFERENCE.model_copy(update={"fusion": fusion, **PRODUCT_PARTS})
        held = scores(held_out, params, audited=True)
        tuned = [r for d in dialogues if d is not held_out for r in scores(d, params, audited=True)]
        every += held
        rows.append(
            {
                "recall_at_10": pooled(held),
                "recall_at_5": pooled(held, 1),
                "tuned_on_recall_at_10": pooled(tuned),
                "tuned_on_recall_at_5": pooled(tuned, 1),
            }
        )
    summary = _summary(rows, every, stdev=False)
    print(
        f"\nagainst the evidence audit ({match.disputed} questions of these dialogues disputed, "
        f"{match.recited} of them re-cited; the fusion still fitted on the published evidence):",
        end="",
    )
    _print_summary(summary, rows)
    return {"disputed": match.disputed, "recited": match.recited, **summary}


def _learned(dialogues: list[Dialogue], audit: AuditMatch | None = None) -> dict[str, object]:
    """The learned fusion, held out: each fold fits it on the other dialogues (`fit_fusion`);
    with `audit`, also scored against the evidence it cites (`_against_audit`)."""
    print("\nlearned fusion (core.recall.FEATURES), fitted per fold on the training dialogues:")
    print(
        "fold (held out) | tuned on | tuned-on r@10 | held-out r@10 | held-out r@5 | "
        "c1 | c2 | c3 | c4 | tuned-on c1 | c2 | c3 | c4"
    )
    rows, fusions, every, without_parts, budgets = [], [], [], [], []
    for held_out in dialogues:
        train = [d for d in dialogues if d is not held_out]
        row, fusion, held, without, budget = _learned_fold(held_out, train)
        rows.append(row)
        fusions.append(fusion)
        every += held
        without_parts.append(without)
        budgets.append(budget)
    summary = _summary(rows, every, stdev=False)
    _print_summary(summary, rows)
    print(
        "two-event questions (core.recall.query_parts) asked as the product asks them "
        f"({PRODUCT_PARTS['part_budget']} slot(s) per part from its best "
        f"{PRODUCT_PARTS['part_depth']}); slots per part / depth the training dialogues would "
        "choose: "
        + ", ".join(
            f"{b} without {short_name(d.name)}" for b, d in zip(budgets, dialogues, strict=True)
        )
        + f"; held-out mean recall@10 without the parts {np.mean(without_parts):.3f}, with them "
        f"{summary['held_out_mean_recall_at_10']:.3f}"
    )
    forced_parts = _parts_always_on(dialogues, fusions)
    print(
        "  always on (slots per part / depth), held-out mean recall@10: "
        + ", ".join(f"{k} {v:.3f}" for k, v in forced_parts.items())
    )
    summary["part_budgets"] = budgets
    summary["parts_always_on_held_out_mean_recall_at_10"] = forced_parts
    summary["held_out_mean_recall_at_10_without_parts"] = round(float(np.mean(without_parts)), 4)
    consensus = _print_fusions(dialogues, fusions)
    learned: dict[str, object] = {
        "folds": rows,
        "summary": summary,
        "consensus": consensus.model_dump(),
    }
    if audit is not None:
        learned["against_evidence_audit"] = _against_audit(dialogues, fusions, audit)
    return learned


def _tuned_fold(
    held_out: Dialogue, train: list[Dialogue]
) -> tuple[RecallParams, dict[str, object]]:
    """One fold of the reciprocal-rank fusion: the knobs tuned on `train`, its row (printed)."""
    params, _ = tune(train)
    held = scores(held_out, params)
    row = _fold_row(held_out, train, params, held, "params", params.model_dump())
    cats = " | ".join(f"{row['categories'][str(c)]:.3f}" for c in CATEGORIES)
    print(
        f"{held_out.name} | {'+'.join(short_name(d.name) for d in train)} | "
        f"{changed_knobs(params)} | {row['tuned_on_recall_at_10']:.3f} | "
        f"{row['recall_at_10']:.3f} | {row['recall_at_5']:.3f} | {cats}"
    )
    return params, row


def _choices(folds: list[Fold]) -> dict[str, dict[str, list[str]]]:
    """Which folds chose each value of each knob (printed)."""
    print("\nwhich folds chose each value (reference value in brackets):")
    choices: dict[str, dict[str, list[str]]] = {}
    for knob in KNOBS:
        by_value: dict[str, list[str]] = {}
        for held_out, _, params in folds:
            by_value.setdefault(f"{getattr(params, knob):g}", []).append(
                f"without {short_name(held_out.name)}"
            )
        choices[knob] = by_value
        print(
            f"  {knob} [{getattr(REFERENCE, knob):g}]: "
            + "; ".join(f"{v} by {len(f)} ({', '.join(f)})" for v, f in by_value.items())
        )
    return choices


def _on_all(
    dialogues: list[Dialogue], folds: list[Fold]
) -> tuple[RecallParams, list[Row], list[Row]]:
    """The folds' consensus, and the reference values and the defaults on every dialogue (not
    held out): the consensus and the rows of both (printed)."""
    rrf_defaults = DEFAULT_PARAMS.model_copy(update={"fusion": None})
    consensus = rrf_defaults.model_copy(
        update={knob: consensus_value(knob, [p for _, _, p in folds]) for knob in KNOBS}
    )
    print(
        f"the folds' choice (per knob, the value most folds chose; a tie goes to the value nearer "
        f"the reference): {changed_knobs(consensus)}"
    )
    if consensus != rrf_defaults:
        print(
            f"  NOTE: core.recall.DEFAULT_PARAMS differs from it ({changed_knobs(DEFAULT_PARAMS)})"
        )
    reference = [r for d in dialogues for r in scores(d, REFERENCE)]
    rrf_all = [r for d in dialogues for r in scores(d, rrf_defaults)]
    print(
        f"\nreciprocal-rank fusion with core.recall.DEFAULT_PARAMS's knobs on all dialogues (not "
        f"held out): recall@10 {pooled(rrf_all):.3f}, recall@5 {pooled(rrf_all, 1):.3f}"
    )
    defaults = [r for d in dialogues for r in scores(d, DEFAULT_PARAMS)]
    print(
        f"reference values (before the protocol) on all dialogues: recall@10 "
        f"{pooled(reference):.3f}, recall@5 {pooled(reference, 1):.3f}"
    )
    print(
        f"core.recall.DEFAULT_PARAMS on all dialogues (tuned on all of them: not held out): "
        f"recall@10 {pooled(defaults):.3f}, recall@5 {pooled(defaults, 1):.3f}; "
        + ", ".join(
            f"{short_name(d.name)} {pooled(scores(d, DEFAULT_PARAMS)):.3f}" for d in dialogues
        )
    )
    return consensus, reference, defaults


def _alternatives(folds: list[Fold]) -> dict[str, object]:
    """Each alternative of ALTERNATIVES held out like the knobs, and each option forced on."""
    print(
        "\nalternatives, held out the same way (each fold adopts an option only for a training gain "
        f">= {MIN_GAIN}):"
    )
    alternatives = {}
    for title, options in ALTERNATIVES.items():
        mean, chosen = held_out_with_choice(folds, options)
        forced = {name: round(held_out_forced(folds, name, rerank), 4) for name, rerank in options}
        alternatives[title] = {
            "held_out_mean_recall_at_10": round(mean, 4),
            "chosen_by_folds": chosen,
            "always_on_held_out_mean": forced,
        }
        print(
            f"  {title}: held-out mean {mean:.3f} (folds chose: {', '.join(chosen)}); always on: "
            + ", ".join(f"{n} {v:.3f}" for n, v in forced.items())
        )
    return alternatives


def run(
    paths: list[Path],
    cache_dir: Path | None,
    learned_only: bool = False,
    audit: EvidenceAudit | None = None,
) -> dict[str, object]:
    """The report, in the order printed: the learned fusion held out (and against `audit`'s
    evidence, if given); then (unless `learned_only`) the reciprocal-rank fusion's folds,
    their summary, the values chosen, the figures on every dialogue and the alternatives."""
    started = time.perf_counter()
    dialogues = [load(path, cache_dir) for path in paths]
    print(
        f"{len(dialogues)} dialogues, {sum(len(d.questions) for d in dialogues)} questions of "
        f"categories 1-4 with evidence, loaded in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    learned = _learned(dialogues, apply_audit(dialogues, audit) if audit is not None else None)
    if learned_only:
        print(f"\n(done in {time.perf_counter() - started:.0f} s)")
        return {"learned": learned}
    print(
        "\nfor comparison, reciprocal-rank fusion with its boosts (fusion=None), the knobs tuned "
        "per fold:"
    )
    print(
        "fold (held out) | tuned on | chosen | tuned-on r@10 | held-out r@10 | held-out r@5 | "
        "c1 | c2 | c3 | c4"
    )
    folds: list[Fold] = []
    rows = []
    for held_out in dialogues:
        train = [d for d in dialogues if d is not held_out]
        params, row = _tuned_fold(held_out, train)
        folds.append((held_out, train, params))
        rows.append(row)
    every = [r for held_out, _, params in folds for r in scores(held_out, params)]
    summary = _summary(rows, every, stdev=True)
    _print_summary(summary, rows)
    choices = _choices(folds)
    consensus, reference, defaults = _on_all(dialogues, folds)
    alternatives = _alternatives(folds)
    print(f"\n(done in {time.perf_counter() - started:.0f} s)")
    return {
        "learned": learned,
        "folds": rows,
        "summary": summary,
        "choices": choices,
        "alternatives": alternatives,
        "consensus": consensus.model_dump(),
        "reference_all": round(pooled(reference), 4),
        "defaults_all": round(pooled(defaults), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recall_protocol",
        description=" ".join(__doc__.split("\n\n")[0].split()),
    )
    add_dialogue_options(parser)
    parser.add_argument(
        "--json", type=Path, default=None, metavar="FILE", help="also write the figures as JSON"
    )
    parser.add_argument(
        "--embedder",
        choices=sorted(CANDIDATES),
        default=DEFAULT,
        help=f"the embedding model measured (bench.embedders; default {DEFAULT}, the product's)",
    )
    parser.add_argument(
        "--learned-only",
        action="store_true",
        help="only the learned fusion (the product's), without the reciprocal-rank comparison and "
        "the alternatives (minutes instead of half an hour on a busy machine)",
    )
    parser.add_argument(
        "--evidence-audit",
        type=Path,
        default=None,
        metavar="DIR",
        help="also score the learned fusion against the evidence an audit of LoCoMo's answer "
        "key cites (its errors_conv_*.json files, dial481/locomo-audit's audit/ folder; "
        "bench/evidence_audit.py)",
    )
    args = parser.parse_args()
    paths = dialogue_paths(parser, args.dialogues)
    try:
        audit = read_audit(args.evidence_audit) if args.evidence_audit else None
    except InvalidInputError as exc:
        parser.error(str(exc))
    use_embedder(args.embedder)
    print(f"embedder: {args.embedder}", flush=True)
    try:
        result = run(paths, args.cache, args.learned_only, audit)
    except EmbedderUnavailableError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
