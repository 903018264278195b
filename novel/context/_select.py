"""Per-kind selectors: prose excerpts, canon cards, lore, characters, foreshadowing, recall (CTX-3, CTX-7)."""

from __future__ import annotations

from novelbus.novel.body import CanonChange
from novelbus.novel.context._hashing import json_size
from novelbus.novel.context._ledger import (
    OMISSIONS_LISTED,
    Candidate,
    Ledger,
    content_digest,
    select_ranked,
)
from novelbus.novel.context._request import (
    HEADER_RE,
    LORE_CONTENT_MIN_HITS,
    RetrievalPlan,
    keyword_set,
    newest_facts,
    parse_pointer,
    participant_facts,
)
from novelbus.novel.context._structs import CanonCard, ForeshadowingCard, ProseExcerpt
from novelbus.novel.next_work import commit_totals
from novelbus.novel.outline import (
    Chapter,
    Character,
    LoreEntry,
    Outline,
)
from novelbus.novel.snapshot import CommitView
from novelbus.novel.text import one_line, tail, truncate


def escape_prose(text: str) -> str:
    """A prose line that looks like a block header is indented, so it cannot end a block."""
    if "[[" not in text:
        return text
    return "\n".join(
        (" " + line) if HEADER_RE.match(line.strip()) else line for line in text.split("\n")
    )


def chapter_excerpt(
    role: str,
    chapter_id: str,
    commits: list[CommitView],
    prose: dict[str, list[str]],
    window: int | None,
    ledger: Ledger,
) -> ProseExcerpt:
    """One baseline chapter: its commits' raw prose joined by blank lines, optionally the tail
    window; every commit is recorded as a source (or omitted when wholly outside the window)."""
    parts = [escape_prose("\n\n".join(prose[c.commit_id])) for c in commits]
    text = "\n\n".join(parts)
    total = len(text)
    start = 0
    if window is not None:
        cut = tail(text, window)
        if cut != text:  # truncated: drop a dangling paragraph break after the marker
            cut = cut[0] + cut[1:].lstrip()
            start = total - (len(cut) - 1)
            ledger.trim("L1", role, chapter_id, len(cut), total, "window: raw tail of the chapter")
        text = cut
    offset = 0
    for c, part in zip(commits, parts, strict=True):
        end = offset + len(part)
        cand = Candidate(role, "L1", 0, c.seq, c.commit_id, 0, len(part), digest=content_digest(part))
        if end <= start:
            ledger.omit(cand, "outside-window")
        else:
            ledger.take(cand, chars=end - max(offset, start))
        offset = end + 2
    return ProseExcerpt(
        role=role,
        chapter_id=chapter_id,
        pointers=[c.commit_id for c in commits],
        commits=len(commits),
        text=text,
        total_chars=total,
        source_version=commits[0].seq if commits else 0,
        source_offset=start,
    )


def _verified(
    change: CanonChange, counts: dict[str, int], seqs: dict[str, int], as_of: int
) -> bool:
    """CTX-3: every pointer resolves to prose at or before asOf (else the card is a hint)."""
    if not change.sources:
        return False
    for source in change.sources:
        parsed = parse_pointer(source)
        if parsed is None or seqs.get(parsed[0], as_of + 1) > as_of:
            return False
        if parsed[1] is not None and parsed[1] >= counts.get(parsed[0], 0):
            return False
    return True


def select_canon_cards(
    plan: RetrievalPlan,
    live: list[CommitView],
    counts: dict[str, int],
    seqs: dict[str, int],
    ledger: Ledger,
) -> list[CanonCard]:
    as_of = plan.request.as_of
    # score = recency (1000 × seq + index): ordering by the CTX-5 key is newest first.
    # (scores are unique, so the score alone decides; the full key would give the same order)
    facts = newest_facts(plan, live)

    def candidate(commit: CommitView, index: int, change: CanonChange) -> Candidate:
        size = len(change.summary) + len(change.detail or "")
        return Candidate(
            "canon", "L2", commit.seq * 1000 + index, commit.seq, commit.commit_id, index, size,
            digest=content_digest(f"{change.kind}\n{change.summary}\n{change.detail or ''}\n"
                                  f"{' '.join(change.sources)}\n{' '.join(change.character_ids)}"),
        )

    cap = plan.budget.max_canon
    cut = facts[cap:]
    listed = cut[:OMISSIONS_LISTED]
    for commit, index, change in listed:
        ledger.omit(candidate(commit, index, change), f"cap:{cap}")
    if len(cut) > len(listed):
        commit, index, change = cut[len(listed)]
        ledger.omit(candidate(commit, index, change), f"cap:{cap}", count=len(cut) - len(listed))
    cards = []
    for commit, index, change in facts[:cap]:
        c = candidate(commit, index, change)
        c.verified = _verified(change, counts, seqs, as_of)
        ledger.take(c)
        cards.append(
            CanonCard(
                commit_id=commit.commit_id,
                seq=commit.seq,
                index=index,
                change=change,
                verified=c.verified,
            )
        )
    return sorted(cards, key=lambda card: (card.seq, card.index))


def select_lore(outline: Outline, plan: RetrievalPlan, ledger: Ledger) -> list[LoreEntry]:
    text = plan.lore_text
    scene_kw = set(plan.lore_keywords)
    candidates = []
    for index, entry in enumerate(outline.lore):
        if entry.disabled:
            continue
        key_hits = 0
        for key in entry.keys:
            flat = one_line(key).lower()
            if flat and (flat in text or scene_kw.intersection(keyword_set(flat))):
                key_hits += 1
        content_hits = len(scene_kw.intersection(keyword_set(entry.content)))
        if key_hits or content_hits >= LORE_CONTENT_MIN_HITS:
            candidates.append(
                Candidate(
                    "lore",
                    "L2",
                    key_hits * 1000 + content_hits,
                    0,
                    entry.entryId,
                    index,
                    len(entry.content),
                    entry,
                )
            )
    kept = select_ranked(candidates, plan.budget.max_lore, ledger, f"cap:{plan.budget.max_lore}")
    return [c.payload for c in sorted(kept, key=lambda c: c.offset)]


def select_characters(outline: Outline, plan: RetrievalPlan, ledger: Ledger) -> list[Character]:
    wanted = set(plan.character_candidates)
    chars = [c for c in outline.characters if c.characterId in wanted]
    n = len(chars)
    candidates = [
        Candidate("character", "L2", n - i, 0, c.characterId, i, json_size(c), c)
        for i, c in enumerate(chars)
    ]
    kept = select_ranked(
        candidates, plan.budget.max_characters, ledger, f"cap:{plan.budget.max_characters}"
    )
    return [c.payload for c in sorted(kept, key=lambda c: c.offset)]


def select_foreshadowing(
    outline: Outline, chapter: Chapter, status: dict[str, str], plan: RetrievalPlan, ledger: Ledger
) -> list[ForeshadowingCard]:
    orders = {c.chapterId: c.order for c in outline.chapters}
    items = outline.foreshadowing
    candidates = []
    for i, item in enumerate(items):
        current = status.get(item.id, item.status)
        if current == "resolved":
            continue
        planted_by_now = item.plantAt is not None and orders[item.plantAt] <= chapter.order
        if not (item.required or planted_by_now):
            continue
        candidates.append(
            Candidate(
                "foreshadowing",
                "L2",
                len(items) - i,
                0,
                item.id,
                i,
                len(item.description),
                ForeshadowingCard(item=item, status=current),
            )
        )
    cap = plan.budget.max_foreshadowing
    kept = select_ranked(candidates, cap, ledger, f"cap:{cap}")
    return [c.payload for c in sorted(kept, key=lambda c: c.offset)]


def select_recall(
    plan: RetrievalPlan,
    live: list[CommitView],
    prose: dict[str, list[str]],
    baseline: set[str],
    ledger: Ledger,
) -> list[ProseExcerpt]:
    """Prose recalled through participants' canon-card pointers, deduplicated by immutable
    source (commit id + paragraph index), never repeating the continuity baseline."""
    by_id = commit_totals(plan.request.novel_id, live).by_id  # read only (SERVE-8)
    found: dict[tuple[str, int], tuple[set[str], bool]] = {}
    for _, _, change in participant_facts(plan, live):
        named = set(change.character_ids).intersection(plan.participants)
        for source in change.sources:
            parsed = parse_pointer(source)
            if parsed is None or parsed[0] not in by_id or parsed[0] not in prose:
                continue
            commit_id, para = parsed
            paragraphs = prose[commit_id]
            indexes = range(len(paragraphs)) if para is None else [para]
            for i in indexes:
                if i >= len(paragraphs):
                    continue
                who, exact = found.get((commit_id, i), (set(), False))
                found[(commit_id, i)] = (who | named, exact or para is not None)
    budget = plan.budget
    candidates = []
    for (commit_id, i), (who, exact) in found.items():
        commit = by_id[commit_id]
        paragraphs = prose[commit_id]
        offset = sum(len(p) + 2 for p in paragraphs[:i])
        text = one_line(paragraphs[i])
        candidates.append(
            Candidate(
                "recall",
                "L1",
                2 * len(who) + (1 if exact else 0),
                commit.seq,
                commit_id,
                offset,
                len(text),
                (commit, i, text),
                digest=content_digest(text),
            )
        )
    kept: list[Candidate] = []
    used = 0
    for cand in sorted(candidates, key=Candidate.key):
        size = min(cand.chars, budget.recall_excerpt_chars)
        if cand.payload[0].chapter_id in baseline:
            ledger.omit(cand, "duplicate:in-baseline")
        elif len(kept) >= budget.recall_excerpts:
            ledger.omit(cand, f"budget:recall-excerpts {budget.recall_excerpts}")
        elif used + size > budget.recall_chars:
            ledger.omit(cand, f"budget:recall-chars {budget.recall_chars}")
        else:
            kept.append(cand)
            used += size
            ledger.take(cand, chars=size)
            if size < cand.chars:
                ledger.trim("L1", "recall", cand.source_id, size, cand.chars, "excerpt limit")
    out = []
    for cand in sorted(kept, key=lambda c: (c.version, c.offset)):
        commit, i, text = cand.payload
        out.append(
            ProseExcerpt(
                role="recall",
                chapter_id=commit.chapter_id,
                pointers=[f"{commit.commit_id}#{i}"],
                commits=1,
                text=truncate(text, budget.recall_excerpt_chars),
                total_chars=len(text),
                source_version=commit.seq,
                source_offset=cand.offset,
            )
        )
    return out
