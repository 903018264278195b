"""STUDY-4: the figures of a study, from the votes alone.

- `outcome`: a vote's choice (a, b, tie, both-bad) as the arm under test's outcome (win, loss,
  tie, both-bad), given which arm was shown as A.
- `cohen_kappa` (two raters) and `krippendorff_alpha` (any number, missing ratings allowed,
  nominal): agreement on those outcomes, item by item.
- `win_share_interval`: the arm under test's share of wins among decided votes with a 95 %
  percentile interval from a bootstrap clustered by scene: whole pairs are resampled, so the
  several votes on one pair count as one draw, not as independent evidence. The seed is passed
  in; the same votes and seed give the same interval.
- `position_bias`: a reviewer's share of A among its decided votes (0.5: none).
- `position_consistency`: the share of a model judge's (pair, criterion) verdicts that name the
  same arm in both orders (MT-Bench's swap rule).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal

Choice = Literal["a", "b", "tie", "both-bad"]
Outcome = Literal["win", "loss", "tie", "both-bad"]
OUTCOMES: tuple[Outcome, ...] = ("win", "loss", "tie", "both-bad")


def outcome(choice: str, a_is_test: bool) -> Outcome:
    """The test arm's outcome of one vote."""
    if choice == "a":
        return "win" if a_is_test else "loss"
    if choice == "b":
        return "loss" if a_is_test else "win"
    if choice == "tie":
        return "tie"
    if choice == "both-bad":
        return "both-bad"
    raise ValueError(f"unknown choice {choice!r}")


def cohen_kappa(x: Sequence[Hashable], y: Sequence[Hashable]) -> float | None:
    """Cohen's κ of two raters' labels on the same items; None without items, or when both
    raters give one and the same label to every item (chance agreement 1: κ is undefined)."""
    if len(x) != len(y):
        raise ValueError("both raters must label the same items")
    n = len(x)
    if n == 0:
        return None
    observed = sum(a == b for a, b in zip(x, y, strict=True)) / n
    cx, cy = Counter(x), Counter(y)
    expected = sum(cx[label] * cy[label] for label in cx) / (n * n)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1.0 - expected)


def krippendorff_alpha(units: Sequence[Sequence[Hashable]]) -> float | None:
    """Krippendorff's α for nominal data: one list of ratings per item (any number of raters;
    items with fewer than two ratings do not count). None when fewer than two pairable ratings
    or no disagreement is possible (every rating the same value)."""
    coincidence: defaultdict[tuple[Hashable, Hashable], float] = defaultdict(float)
    for ratings in units:
        m = len(ratings)
        if m < 2:
            continue
        for i, a in enumerate(ratings):
            for j, b in enumerate(ratings):
                if i != j:
                    coincidence[(a, b)] += 1.0 / (m - 1)
    n_c: defaultdict[Hashable, float] = defaultdict(float)
    for (a, _), weight in coincidence.items():
        n_c[a] += weight
    n = sum(n_c.values())
    if n < 2:
        return None
    observed = sum(w for (a, b), w in coincidence.items() if a != b)
    expected = sum(n_c[a] * n_c[b] for a in n_c for b in n_c if a != b) / (n - 1)
    if expected == 0:
        return None
    return 1.0 - observed / expected


class _SplitMix64:
    """A seeded stream of integers (SplitMix64): the bootstrap's draws, passed in as a seed so
    the domain stays free of hidden randomness (ARCH-3)."""

    MASK = (1 << 64) - 1

    def __init__(self, seed: int) -> None:
        self.state = seed & self.MASK

    def below(self, n: int) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return (z ^ (z >> 31)) % n


def win_share(outcomes: Sequence[Outcome]) -> float | None:
    wins, losses = outcomes.count("win"), outcomes.count("loss")
    return None if wins + losses == 0 else wins / (wins + losses)


def win_share_interval(by_pair: Mapping[str, Sequence[Outcome]], *, seed: int, resamples: int = 2_000,
                       level: float = 0.95) -> tuple[float, float] | None:
    """The 95 % percentile interval of the win share, resampling whole pairs (clustered by
    scene). None without a decided vote."""
    clusters = [(list(v).count("win"), list(v).count("loss")) for _, v in sorted(by_pair.items())]
    if sum(w + loss for w, loss in clusters) == 0:
        return None
    rng = _SplitMix64(seed)
    shares: list[float] = []
    k = len(clusters)
    for _ in range(resamples):
        wins = decided = 0
        for _ in range(k):
            w, loss = clusters[rng.below(k)]
            wins += w
            decided += w + loss
        if decided:
            shares.append(wins / decided)
    shares.sort()
    tail = (1.0 - level) / 2
    low = shares[min(len(shares) - 1, int(tail * len(shares)))]
    high = shares[min(len(shares) - 1, max(0, int((1.0 - tail) * len(shares)) - 1))]
    return low, high


def position_bias(choices: Sequence[str]) -> float | None:
    """Share of A among a reviewer's A/B votes (ties and both-bad left out); None without one."""
    decided = [c for c in choices if c in ("a", "b")]
    return None if not decided else decided.count("a") / len(decided)


def position_consistency(pairs: Sequence[tuple[Outcome, Outcome]]) -> float | None:
    """Share of verdict pairs (the same item judged in both orders, mapped to the test arm's
    outcome) that agree; None without any."""
    if not pairs:
        return None
    return sum(one == two for one, two in pairs) / len(pairs)
