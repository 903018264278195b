"""The seed's other roles in the benchmarks (ROLE-5): detector and extractor calls and usage per unit.

Read from the store after a run: the detector's records (`detections`, one per candidate checked:
its outcome), the extractor's ledger (`extracted_commits`, one per commit read) and the usage
totals of the modes `detector` and `extractor` (model calls only; the offline roles make none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from novelbus import store


@dataclass
class RoleFigures:
    units: int = 0  # committed units
    detector_checks: int = 0
    detector_outcomes: dict[str, int] = field(default_factory=dict)
    extractor_calls: int = 0
    extractor_outcomes: dict[str, int] = field(default_factory=dict)
    usage: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> calls, tokens

    def per_unit(self, n: float) -> float:
        return round(n / self.units, 3) if self.units else 0.0

    def as_json(self) -> dict[str, Any]:
        def mode(name: str) -> dict[str, Any]:
            u = self.usage.get(name, {})
            return {"modelCalls": int(u.get("calls", 0)),
                    "modelCallsPerUnit": self.per_unit(u.get("calls", 0)),
                    "inputTokensPerUnit": self.per_unit(u.get("inputTokens", 0)),
                    "outputTokensPerUnit": self.per_unit(u.get("outputTokens", 0))}

        return {
            "units": self.units,
            "detector": {"checks": self.detector_checks, "checksPerUnit": self.per_unit(self.detector_checks),
                         "outcomes": dict(sorted(self.detector_outcomes.items())), **mode("detector")},
            "extractor": {"calls": self.extractor_calls, "callsPerUnit": self.per_unit(self.extractor_calls),
                          "outcomes": dict(sorted(self.extractor_outcomes.items())), **mode("extractor")},
        }

    def lines(self) -> list[tuple[str, str]]:
        """(label, value) rows for a report table."""
        j = self.as_json()
        d, x = j["detector"], j["extractor"]
        outcomes = ", ".join(f"{k} {v}" for k, v in d["outcomes"].items()) or "none"
        return [
            ("detector checks per unit", f"{d['checksPerUnit']:.2f} ({outcomes})"),
            ("detector model calls / input tokens per unit", f"{d['modelCallsPerUnit']:.2f} / "
                                                             f"{d['inputTokensPerUnit']:,.0f}"),
            ("extractor calls per unit", f"{x['callsPerUnit']:.2f}"),
            ("extractor model calls / input tokens per unit", f"{x['modelCallsPerUnit']:.2f} / "
                                                              f"{x['inputTokensPerUnit']:,.0f}"),
        ]


async def _count_by(pool: Any, sql: str, novel_ids: list[str]) -> dict[str, int]:
    try:
        rows = await pool.fetch(sql, novel_ids)
    except Exception:  # noqa: BLE001 - a store without that role's table: nothing to count
        return {}
    return {r["outcome"]: int(r["n"]) for r in rows}


async def role_figures(pool: Any, novel_ids: list[str]) -> RoleFigures:
    """The detector's and the extractor's figures over these novels (ROLE-5)."""
    out = RoleFigures()
    out.units = int(await pool.fetchval("SELECT count(*) FROM commits WHERE novel_id = ANY($1::text[])",
                                        novel_ids) or 0)
    out.detector_outcomes = await _count_by(
        pool, "SELECT outcome, count(*) AS n FROM detections WHERE novel_id = ANY($1::text[]) GROUP BY outcome",
        novel_ids)
    out.detector_checks = sum(out.detector_outcomes.values())
    out.extractor_outcomes = await _count_by(
        pool, "SELECT outcome, count(*) AS n FROM extracted_commits WHERE novel_id = ANY($1::text[])"
              " GROUP BY outcome", novel_ids)
    out.extractor_calls = sum(out.extractor_outcomes.values())
    for novel_id in novel_ids:
        for mode, totals in (await store.usage_totals(pool, novel_id)).items():
            if mode in ("detector", "extractor"):
                acc = out.usage.setdefault(mode, {})
                for key in ("calls", "inputTokens", "outputTokens"):
                    value = totals.get(key)
                    if isinstance(value, int | float):
                        acc[key] = acc.get(key, 0) + value
    return out
