"""STUDY-4 / STUDY-6: a study's figures and the pre-registered rule applied to them.

`figures` turns the votes (people's and model judges', already anonymous: reviewer aliases, the
opaque pair ids, which arm was A) and each arm's provider-reported usage into the report; its
`verdict` is the rule's. Everything is a pure function of its inputs, so a stored decision
record can be generated again from the inputs it keeps (`decision_inputs`) and compared.

The rule (the study file's `rule`, docs/studies.md):
- cost: the arm under test's raw input per committed unit, over the baseline's, at most
  `costRatio` (provider-reported tokens when every call of both arms reported them, else the
  service's own estimate, and the report says which);
- quality, per criterion: the lower bound of the 95 % interval of the test arm's win share among
  decided votes is at least 0.5 − `notWorseMargin` (a criterion with no decided vote is even);
- enough evidence: at least `minPairs` pairs with `minReviewersPerPair` people who voted on
  every criterion; fewer, and the verdict is `undecided`;
- a model judge's votes count only when its κ with the people's majority reaches `judgeKappa`
  and its position consistency `judgePositionConsistency`; otherwise they are reported, ignored.
Verdict: the test arm when both halves pass, the baseline when one fails, `undecided` without
enough people's votes or without a cost figure (whatever the other half says).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from novelbus.novel.study._model import Rule
from novelbus.novel.study._stats import (
    OUTCOMES,
    Outcome,
    cohen_kappa,
    krippendorff_alpha,
    outcome,
    position_bias,
    position_consistency,
    win_share,
    win_share_interval,
)

UNDECIDED = "undecided"


@dataclass(frozen=True)
class Vote:
    """One effective vote (the latest of its reviewer, pair and criterion)."""

    reviewer: str  # an alias (`reviewer-1`, `judge-1`), never a name
    kind: str  # "person" | "judge"
    pair: str
    criterion: str
    choice: str  # a | b | tie | both-bad
    a_is_test: bool


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _judge_outcomes(votes: Sequence[Vote]) -> dict[tuple[str, str], tuple[Outcome, ...]]:
    """A judge's outcomes per (pair, criterion), one per order it judged."""
    out: defaultdict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for v in sorted(votes, key=lambda v: (v.pair, v.criterion, not v.a_is_test)):
        out[(v.pair, v.criterion)].append(outcome(v.choice, v.a_is_test))
    return {k: tuple(v) for k, v in out.items()}


def _combined(outcomes: tuple[Outcome, ...]) -> Outcome:
    """Two orders that disagree are a tie (MT-Bench's swap rule)."""
    return outcomes[0] if len(set(outcomes)) == 1 else "tie"


def _majority(labels: Sequence[Outcome]) -> Outcome:
    counts = Counter(labels).most_common()
    return counts[0][0] if len(counts) == 1 or counts[0][1] > counts[1][1] else "tie"


def cost_figures(test: Mapping[str, Any], base: Mapping[str, Any], limit: float) -> dict[str, Any]:
    """The cost half from each arm's usage: {units, inputTokens (provider; None unless every call
    reported), estInputTokens, windowPeakTokens, estWindowPeakTokens, bill}."""
    def per_unit(arm: Mapping[str, Any], key: str) -> float | None:
        value, units = arm.get(key), int(arm.get("units") or 0)
        return None if value is None or units <= 0 else float(value) / units

    provider = (per_unit(test, "inputTokens"), per_unit(base, "inputTokens"))
    estimate = (per_unit(test, "estInputTokens"), per_unit(base, "estInputTokens"))
    source, (t, b) = ("provider", provider) if None not in provider else ("estimate", estimate)
    ratio = None if t is None or b is None or b == 0 else t / b
    return {"source": source, "ratio": _r(ratio), "limit": limit, "ok": None if ratio is None else ratio <= limit,
            "test": dict(test), "base": dict(base),
            "bill": {"test": test.get("bill") or "no prices", "base": base.get("bill") or "no prices"}}


def figures(*, rule: Rule, criteria: Sequence[str], compare: Sequence[str], votes: Sequence[Vote],
            pairs: Sequence[str], cost: Mapping[str, Mapping[str, Any]], seed: int) -> dict[str, Any]:
    """The report of a study (STUDY-4) with the rule's verdict (STUDY-6)."""
    test_arm, base_arm = compare[0], compare[1]
    people = sorted({v.reviewer for v in votes if v.kind == "person"})
    judges = sorted({v.reviewer for v in votes if v.kind == "judge"})
    person_votes = [v for v in votes if v.kind == "person"]
    # People's outcomes per item (pair, criterion) and reviewer.
    items: defaultdict[tuple[str, str], dict[str, Outcome]] = defaultdict(dict)
    for v in person_votes:
        items[(v.pair, v.criterion)][v.reviewer] = outcome(v.choice, v.a_is_test)
    # Agreement between people on the test arm's outcome (not on letters: positions differ).
    agreement: dict[str, Any] = {"items": sum(1 for rated in items.values() if len(rated) >= 2),
                                 "alpha": _r(krippendorff_alpha([list(r.values()) for r in items.values()])),
                                 "method": "krippendorff-alpha-nominal"}
    if len(people) == 2:
        shared = [r for r in items.values() if len(r) == 2]
        agreement["kappa"] = _r(cohen_kappa([r[people[0]] for r in shared], [r[people[1]] for r in shared]))
        agreement["method"] = "cohen-kappa"
    else:
        agreement["kappa"] = None
    bias = {alias: _r(position_bias([v.choice for v in person_votes if v.reviewer == alias])) for alias in people}
    # Model judges: agreement with the people's majority and position consistency.
    majority = {key: _majority(list(rated.values())) for key, rated in items.items() if rated}
    judge_report: dict[str, Any] = {}
    counted: dict[str, dict[tuple[str, str], Outcome]] = {}
    for alias in judges:
        judged = _judge_outcomes([v for v in votes if v.reviewer == alias])
        both = [(o[0], o[1]) for o in judged.values() if len(o) >= 2]
        combined = {key: _combined(o) for key, o in judged.items()}
        shared_keys = sorted(k for k in combined if k in majority)
        kappa = cohen_kappa([combined[k] for k in shared_keys], [majority[k] for k in shared_keys])
        consistency = position_consistency(both)
        counts = (kappa is not None and kappa >= rule.judgeKappa and consistency is not None
                  and consistency >= rule.judgePositionConsistency)
        judge_report[alias] = {"kappa": _r(kappa), "items": len(shared_keys), "positionConsistency": _r(consistency),
                               "positionBias": _r(position_bias([v.choice for v in votes if v.reviewer == alias])),
                               "counted": counts}
        if counts:
            counted[alias] = combined
    # Tallies per criterion: people's votes, and a counted judge's combined verdict as one more.
    table: dict[str, Any] = {}
    for name in criteria:
        by_pair: defaultdict[str, list[Outcome]] = defaultdict(list)
        for (pair, criterion), rated in items.items():
            if criterion == name:
                by_pair[pair].extend(rated.values())
        for combined in counted.values():
            for (pair, criterion), result in combined.items():
                if criterion == name:
                    by_pair[pair].append(result)
        flat = [o for outcomes in by_pair.values() for o in outcomes]
        interval = win_share_interval(by_pair, seed=seed, resamples=rule.bootstrap)
        tally = Counter(flat)
        table[name] = {"wins": tally["win"], "ties": tally["tie"], "losses": tally["loss"],
                       "bothBad": tally["both-bad"], "share": _r(win_share(flat)),
                       "low": None if interval is None else _r(interval[0]),
                       "high": None if interval is None else _r(interval[1])}
    # Evidence: pairs on which enough people voted on every criterion.
    full: Counter[str] = Counter()
    for alias in people:
        for pair in pairs:
            if all(alias in items.get((pair, c), {}) for c in criteria):
                full[pair] += 1
    enough = sum(1 for pair in pairs if full[pair] >= rule.minReviewersPerPair)
    cost_half = dict(cost.get("figures") or {})
    line = 0.5 - rule.notWorseMargin
    reasons: list[str] = []
    quality_ok: bool | None = None
    if enough < rule.minPairs:
        reasons.append(f"{enough} of the {rule.minPairs} pairs the rule needs have {rule.minReviewersPerPair} "
                       "reviewers' votes on every criterion")
    else:
        worse = [name for name, row in table.items() if row["low"] is not None and row["low"] < line]
        quality_ok = not worse
        if worse:
            reasons.append(f"not shown not worse (lower bound below {line:.2f}) on: {', '.join(worse)}")
    cost_ok = cost_half.get("ok")
    if cost_ok is None:
        reasons.append("the cost half is not measured")
    elif not cost_ok:
        reasons.append(f"raw input ratio {cost_half.get('ratio')} is over {rule.costRatio}")
    if quality_ok is None or cost_ok is None:  # too few people, or no cost figure: the rule cannot decide
        verdict = UNDECIDED
    elif quality_ok and cost_ok:
        verdict = test_arm
    else:
        verdict = base_arm
    return {"verdict": verdict, "compare": [test_arm, base_arm], "criteria": table, "notWorseLine": round(line, 4),
            "agreement": agreement, "positionBias": bias, "judges": judge_report,
            "reviewers": len(people), "pairs": {"ready": len(pairs), "enoughReviewers": enough,
                                                 "needed": rule.minPairs},
            "cost": cost_half, "reasons": reasons, "interval": "percentile bootstrap, 95 %, pairs resampled "
                                                                "(clustered by scene), seed "
                                                                f"{seed}, {rule.bootstrap} resamples",
            "outcomes": list(OUTCOMES)}


def decision_inputs(*, rule: Rule, criteria: Sequence[str], compare: Sequence[str], votes: Sequence[Vote],
                    pairs: Sequence[str], cost: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Everything `figures` reads, as JSON: a decision record keeps it so that anyone can
    generate the decision again (`decide_again`)."""
    return {"rule": rule.model_dump(), "criteria": list(criteria), "compare": list(compare),
            "votes": [asdict(v) for v in votes], "pairs": list(pairs), "cost": dict(cost), "seed": seed}


def decide_again(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """`figures` over a decision record's inputs."""
    return figures(rule=Rule.model_validate(inputs["rule"]), criteria=inputs["criteria"], compare=inputs["compare"],
                   votes=[Vote(**v) for v in inputs["votes"]], pairs=inputs["pairs"], cost=inputs["cost"],
                   seed=int(inputs["seed"]))
