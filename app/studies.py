"""What the study and review commands do, shared by the CLI and the web panel (STUDY-1..8).

Every function takes a connected `ActorContext` (only `ctx.pool` is read, and `create`/`start`
publish the arms' first work notices), returns JSON-ready data and raises a typed `StoreError`
(`store.studies`: StudyNotFound, StudyClosed, StudyNotRunning, PairNotFound, ReviewerRefused,
VoteRefused, DecisionMissing; `store.NovelNotFound`) whose `.code` is stable and whose message
names what is wrong; the CLI turns one into exit 2, the panel into an HTTP status. A bad study
file is a `novel.study.StudyError`.

Two audiences. The operator's functions (`create`, `start`, `status`, `invite`, `report`,
`judge`, `decide`, `adopt`, `default_writer_mode`) name arms, novels and hashes. The reviewer's
(`authenticate`, `redeem_invite`, `next_pair`, `vote`) take a reviewer token and answer with
the opaque pair id, the blind context and two anonymous texts only: no arm, novel, title, id,
hash, model, or anyone else's vote (STUDY-3).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from novelbus import store
from novelbus.app import actions
from novelbus.novel.judge import JudgeReplyError, scene_texts
from novelbus.novel.next_work import finished_scenes, outlined_scenes
from novelbus.novel.outline import Outline
from novelbus.novel.roles.judge import CRITERIA_TEXT, project
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.novel.study import (
    CHOICES,
    FLAG_CATEGORIES,
    ArmScene,
    SceneSample,
    Study,
    Vote,
    a_shows_test,
    attribute,
    check_scene,
    cost_figures,
    decision_inputs,
    figures,
    group_by_field,
    registration_hash,
    reviewer_order,
    sample_scenes,
    study_from_registration,
)
from novelbus.store import studies as db
from novelbus.store.studies import (
    DecisionMissing,
    PairNotFound,
    PairRow,
    ReviewerRefused,
    StudyClosed,
    StudyNotRunning,
    VoteRefused,
    VoteRow,
)
from novelbus.writers.provider import ProviderError

DEFAULT_PANEL_URL = "http://127.0.0.1:8765"
# A question per criterion a reviewer answers (the seed's four, else the criterion's name).
QUESTIONS = {**CRITERIA_TEXT}
# What a model judge answers with ("A", "B", "tie") as a reviewer's choice.
_LETTER = {"A": "a", "B": "b", "tie": "tie"}

Judge = Callable[[dict[str, Any]], Awaitable[Mapping[str, str]]]


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def _study(ctx: Any, study_id: str) -> tuple[db.StudyRow, Study]:
    row = await db.get_study(ctx.pool, study_id)
    return row, study_from_registration(row.registration or row.draft)


# --- the operator's -------------------------------------------------------------------------------


async def create(ctx: Any, study: Study, *, start_arms: bool = True) -> str:
    """STUDY-1: register a validated study; with `start_arms`, freeze it and start its arms."""
    study_id = f"s-{secrets.token_hex(4)}"
    await db.create_study(ctx.pool, study_id, study.file.title, study.registration())
    if start_arms:
        await start(ctx, study_id)
    return study_id


async def start(ctx: Any, study_id: str) -> str:
    """Freeze the registration (STUDY-1: before any arm starts; nothing in it changes after)
    and create each arm's novel, started: the file's novel with the arm's config, written by the
    running actors like any other. Safe to repeat: an arm already created is kept. Returns the
    registration hash."""
    for arm in (await _study(ctx, study_id))[1].file.arms:
        await create_arm(ctx, study_id, arm, start=True)
    return str((await db.get_study(ctx.pool, study_id)).registration_hash)


async def create_arm(ctx: Any, study_id: str, arm: str, *, start: bool = True) -> str:
    """One arm's novel (id `<studyId>-<arm>`), the registration frozen first; with `start`, its
    first work notice is published (`bench ab` publishes its own and follows the arm). An arm
    created already is returned as it is."""
    row, study = await _study(ctx, study_id)
    if row.status == "closed":
        raise StudyClosed(f"study {study_id!r} is closed")
    if arm not in study.file.arms:
        raise VoteRefused(f"{arm[:40]!r} is not an arm of study {study_id!r}")
    registration = row.registration or row.draft
    await db.freeze(ctx.pool, study_id, registration, registration_hash(registration))
    if arm in row.arms:
        return row.arms[arm]
    novel = study.arm_novel(arm).model_copy(update={"novelId": f"{study_id}-{arm}"})
    try:
        novel_id = await actions.create(ctx, novel, start=start)
    except store.NovelExists:
        novel_id = novel.novelId or ""
    await db.add_arm(ctx.pool, study_id, arm, novel_id)
    return novel_id


async def _arm_scene(ctx: Any, novel_id: str, config: Mapping[str, Any], key: tuple[str, str]) -> ArmScene:
    """What the arm's writer was given for one scene: the freeze manifests of the scene's
    committed units (by the commits' context hash) and the writer models of their runs."""
    rows = await ctx.pool.fetch(
        "SELECT c.unit_id, f.manifest, w.provider FROM commits c"
        " LEFT JOIN LATERAL (SELECT manifest FROM context_freeze f WHERE f.novel_id = c.novel_id"
        "   AND f.unit_id = c.unit_id AND f.context_hash = c.context_hash"
        "   ORDER BY (f.manifest -> 'request' ->> 'scenario') = 'generation' DESC LIMIT 1) f ON true"
        " LEFT JOIN writer_runs w ON w.run_id = c.run_id"
        " WHERE c.novel_id = $1 AND c.chapter_id = $2 AND c.scene_id = $3 ORDER BY c.seq",
        novel_id, key[0], key[1])
    manifests = [m if isinstance(m, dict) else json.loads(m) for m in (r["manifest"] for r in rows) if m is not None]
    return ArmScene(manifests=manifests, config=config, models=tuple(sorted({r["provider"] for r in rows
                                                                             if r["provider"]})),
                    units=tuple(r["unit_id"] for r in rows))


def _context(outline: Outline, key: tuple[str, str], base: NovelSnapshot) -> dict[str, Any]:
    """The blind context of a pair: the scene's goal, conflict, time and place, participants by
    name, and the last paragraph of the scene before it (as the baseline arm wrote it)."""
    scene = next(s for s in outline.scenes if (s.chapterId, s.sceneId) == key)
    names = {c.characterId: c.name for c in outline.characters}
    order = list(outlined_scenes(outline))
    previous = ""
    if order.index(key) > 0:
        before = scene_texts(base).get(order[order.index(key) - 1], "")
        previous = before.split("\n\n")[-1] if before else ""
    return {"goal": scene.goal, "conflict": scene.conflict, "timeLocation": scene.timeLocation,
            "participants": [names[p] for p in scene.participants if p in names], "previousParagraph": previous}


async def refresh_pairs(ctx: Any, study_id: str) -> list[PairRow]:
    """Make a pair of every sampled scene both arms have finished (once: its texts are kept as
    they were), with the single-variable check's result (STUDY-2); all pairs, in sample order."""
    row, study = await _study(ctx, study_id)
    known = await db.list_pairs(ctx.pool, study_id)
    test_id, base_id = row.arms.get(study.test_arm), row.arms.get(study.base_arm)
    if test_id is None or base_id is None:
        return known
    outline = study.novel.outline
    spec = study.file.scenes
    scenes = list(outlined_scenes(outline))
    if isinstance(spec, list):
        wanted = {(s.chapterId, s.sceneId) for s in spec}
        sampled = [k for k in scenes if k in wanted]
    else:
        sampled = sample_scenes(scenes, sample=spec.sample if isinstance(spec, SceneSample) else None,
                                seed=spec.seed if isinstance(spec, SceneSample) else study.file.seed)
    done = {(p.chapter_id, p.scene_id) for p in known}
    if all(k in done for k in sampled):
        return known
    test, base = await store.load_snapshot(ctx.pool, test_id), await store.load_snapshot(ctx.pool, base_id)
    ready = finished_scenes(test) & finished_scenes(base)
    test_texts, base_texts = scene_texts(test), scene_texts(base)
    for index, key in enumerate(sampled):
        if key in done or key not in ready:
            continue
        refused = check_scene(study.file.variable,
                              await _arm_scene(ctx, test_id, study.arm_configs[study.test_arm].model_dump(mode="json"),
                                               key),
                              await _arm_scene(ctx, base_id, study.arm_configs[study.base_arm].model_dump(mode="json"),
                                               key))
        pair = PairRow(pair_id=f"p{secrets.token_hex(6)}", pair_index=index, chapter_id=key[0], scene_id=key[1],
                       test_text=test_texts.get(key, ""), base_text=base_texts.get(key, ""),
                       context=_context(outline, key, base), refused=refused)
        await db.save_pair(ctx.pool, study_id, pair)
    return await db.list_pairs(ctx.pool, study_id)


def _reviewable(pairs: list[PairRow]) -> list[PairRow]:
    return [p for p in pairs if not p.refused and p.test_text.strip() and p.base_text.strip()]


async def _arm_cost(ctx: Any, novel_id: str, mode: str) -> dict[str, Any]:
    """One arm's usage: provider-reported input tokens only when every call of every accounted
    turn reported them (else None, never a partial sum), the estimate beside them."""
    novel = await store.get_novel(ctx.pool, novel_id)
    totals = (await store.usage_totals(ctx.pool, novel_id)).get(mode, {})
    units = sum(1 for u in await store.list_units(ctx.pool, novel_id) if u.state == "committed")
    calls, reported = int(totals.get("calls", 0)), int(totals.get("reportedCalls", 0))
    complete = calls > 0 and reported == calls and int(totals.get("samples", 0)) >= novel.turns
    provider = totals.get("inputTokens") if complete else None
    peak = totals.get("windowPeakTokens") if complete else None
    return {"units": units, "calls": calls, "reportedCalls": reported,
            "inputTokens": None if provider is None else int(provider),
            "estInputTokens": int(totals.get("estInputTokens", 0)),
            "windowPeakTokens": None if peak is None else int(peak),
            "estWindowPeakTokens": int(totals.get("estWindowPeakTokens", 0))}


async def status(ctx: Any, study_id: str) -> dict[str, Any]:
    """STUDY-1: each arm's progress and cost, and the pairs ready for review (an int) with the
    excluded ones and the field that differed (STUDY-2)."""
    row, study = await _study(ctx, study_id)
    arms: dict[str, Any] = {}
    for arm, novel_id in row.arms.items():  # read before the pairs: a finished arm's scenes are all paired
        novel = await store.get_novel(ctx.pool, novel_id)
        units = await store.list_units(ctx.pool, novel_id)
        arms[arm] = {"novelId": novel_id, "status": novel.status, "pauseReason": novel.pause_reason,
                     "writerMode": novel.writer_mode,
                     "commits": sum(1 for u in units if u.state == "committed"),
                     "cost": await _arm_cost(ctx, novel_id, novel.writer_mode)}
    for arm in study.file.arms:
        arms.setdefault(arm, {"novelId": None, "status": "not-started", "commits": 0})
    pairs = await refresh_pairs(ctx, study_id)
    reviewers = await db.reviewers(ctx.pool, study_id)
    return {"studyId": study_id, "title": row.title, "status": row.status, "registrationHash": row.registration_hash,
            "variable": study.file.variable, "compare": list(study.file.compare), "arms": arms,
            "pairs": len(_reviewable(pairs)),
            "excluded": [{"chapterId": p.chapter_id, "sceneId": p.scene_id, "fields": p.refused}
                         for p in pairs if p.refused],
            "reviewers": sum(1 for r in reviewers if r.kind == "person"),
            "judges": sum(1 for r in reviewers if r.kind == "judge"),
            "votes": await db.vote_count(ctx.pool, study_id)}


async def invite(ctx: Any, study_id: str, reviewer: str, *, panel_url: str = DEFAULT_PANEL_URL) -> dict[str, Any]:
    """STUDY-3: a person invited to review this study. The token is shown once (stored as its
    sha256); the url is the panel's review page for it, a one-time link (`redeem_invite`)."""
    if not reviewer.strip():
        raise VoteRefused("a reviewer needs a name (it is never shown to anyone but the operator)")
    await db.get_study(ctx.pool, study_id)
    token = secrets.token_urlsafe(24)
    row = await db.add_reviewer(ctx.pool, study_id, kind="person", name=reviewer.strip(), token_hash=token_hash(token))
    return {"token": token, "url": f"{panel_url.rstrip('/')}/review/{study_id}#invite={token}", "alias": row.alias}


def _letters(pair: PairRow, a_is_test: bool) -> tuple[str, str]:
    return (pair.test_text, pair.base_text) if a_is_test else (pair.base_text, pair.test_text)


async def _votes(ctx: Any, study_id: str) -> list[VoteRow]:
    return await db.effective_votes(ctx.pool, study_id)


def _vote_inputs(votes: list[VoteRow]) -> list[Vote]:
    return [Vote(v.alias, v.kind, v.pair_id, v.criterion, v.choice, v.a_is_test) for v in votes]


async def _flags(ctx: Any, study: Study, row: db.StudyRow, votes: list[VoteRow],
                 pairs: dict[str, PairRow]) -> dict[str, Any]:
    """STUDY-5: every flag with what the writer of the flagged text was given, by pack field."""
    flags: list[dict[str, Any]] = []
    for v in votes:
        if v.flag_category is None or v.pair_id not in pairs:
            continue
        pair = pairs[v.pair_id]
        arm = study.test_arm if (v.flag_text == "a") == v.a_is_test else study.base_arm
        key = (pair.chapter_id, pair.scene_id)
        scene = await _arm_scene(ctx, row.arms[arm], {}, key)
        participants = next((s.participants for s in study.novel.outline.scenes
                             if (s.chapterId, s.sceneId) == key), [])
        text = _letters(pair, v.a_is_test)[0 if v.flag_text == "a" else 1]
        flags.append({"reviewer": v.alias, "arm": arm, "chapterId": key[0], "sceneId": key[1],
                      "criterion": v.criterion, "category": v.flag_category,
                      "span": [v.span_start, v.span_end], "spanChars": (v.span_end or 0) - (v.span_start or 0),
                      "units": list(scene.units), "excerptChars": len(text),
                      "attribution": attribute(v.flag_category, list(scene.manifests), participants)})
    return group_by_field(flags)


async def _figures(ctx: Any, study_id: str) -> tuple[db.StudyRow, Study, dict[str, Any], dict[str, Any]]:
    row, study = await _study(ctx, study_id)
    pairs = await refresh_pairs(ctx, study_id)
    ready = _reviewable(pairs)
    cost: dict[str, Any] = {}
    if study.test_arm in row.arms and study.base_arm in row.arms:
        test = await _arm_cost(ctx, row.arms[study.test_arm], study.arm_configs[study.test_arm].writerMode)
        base = await _arm_cost(ctx, row.arms[study.base_arm], study.arm_configs[study.base_arm].writerMode)
        cost = {"figures": cost_figures(test, base, study.file.rule.costRatio)}
    ids = {p.pair_id for p in ready}
    votes = [v for v in _vote_inputs(await _votes(ctx, study_id)) if v.pair in ids]
    inputs = decision_inputs(rule=study.file.rule, criteria=study.file.criteria, compare=study.file.compare,
                             votes=votes, pairs=[p.pair_id for p in ready], cost=cost, seed=study.file.seed)
    result = figures(rule=study.file.rule, criteria=study.file.criteria, compare=study.file.compare, votes=votes,
                     pairs=[p.pair_id for p in ready], cost=cost, seed=study.file.seed)
    return row, study, result, inputs


async def report(ctx: Any, study_id: str) -> dict[str, Any]:
    """STUDY-4 / STUDY-5: the figures so far (the rule's verdict included), the flags traced
    to the pack, and the decision once there is one. Reviewers appear by alias only."""
    row, study, result, _ = await _figures(ctx, study_id)
    pairs = {p.pair_id: p for p in await db.list_pairs(ctx.pool, study_id)}
    result["flags"] = await _flags(ctx, study, row, await _votes(ctx, study_id), pairs)
    result.update({"studyId": study_id, "title": row.title, "status": row.status, "variable": study.file.variable,
                   "registrationHash": row.registration_hash, "rule": study.file.rule.model_dump(),
                   "decision": await db.get_decision(ctx.pool, study_id)})
    return result


async def judge_usage_novel(ctx: Any, study_id: str) -> str | None:
    """The novel a model judge's calls are recorded against, under the mode `judge`: the study's
    test arm (None before that arm has a novel). Its writers' modes stay apart from it."""
    row, study = await _study(ctx, study_id)
    return row.arms.get(study.test_arm)


async def judge(ctx: Any, study_id: str, verdicts: Judge, *, name: str) -> dict[str, Any]:
    """STUDY-4: a model judge (`verdicts`: the blind projection in, a letter per criterion out)
    run on every reviewable pair in both orders, as one more reviewer (`judge-N`); a pair it
    judged already is skipped. Its votes are never shown to a person."""
    row, study = await _study(ctx, study_id)
    if row.status != "running":
        raise (StudyClosed if row.status == "closed" else StudyNotRunning)(
            f"study {study_id!r} is {row.status}: a judge votes only while it runs")
    reviewer = await db.add_reviewer(ctx.pool, study_id, kind="judge", name=name, token_hash=None)
    judged = {(v.pair_id, v.criterion, v.a_is_test) for v in await db.effective_votes(ctx.pool, study_id,
                                                                                       reviewer.alias)}
    outline = study.novel.outline
    written = failed = 0
    for pair in _reviewable(await refresh_pairs(ctx, study_id)):
        for a_is_test in (True, False):
            if all((pair.pair_id, c, a_is_test) in judged for c in study.file.criteria):
                continue
            a, b = _letters(pair, a_is_test)
            try:
                letters = await verdicts(project(outline, pair.chapter_id, pair.scene_id, a, b))
            except (JudgeReplyError, ProviderError):  # a failed judgment is counted, never a tie
                failed += 1
                continue
            for criterion in study.file.criteria:
                letter = letters.get(criterion)
                if letter not in _LETTER:
                    continue
                written += await db.record_vote(ctx.pool, study_id, VoteRow(
                    reviewer.alias, "judge", pair.pair_id, criterion, _LETTER[letter], a_is_test, None, None, None,
                    None))
    return {"judge": reviewer.alias, "votes": written, "failedPairs": failed}


def _record(study_id: str, row: db.StudyRow, study: Study, result: dict[str, Any],
            inputs: dict[str, Any]) -> dict[str, Any]:
    arms = {name: {"writerMode": c.writerMode, "writerShape": c.writerShape} for name, c in study.arm_configs.items()}
    return {"schema": "novelbus.study-decision/1", "studyId": study_id, "title": row.title,
            "command": f"novelbus study decide {study_id} --json", "registrationHash": row.registration_hash,
            "variable": study.file.variable, "arms": arms, "verdict": result["verdict"],
            "reviewers": result["reviewers"], "figures": result, "inputs": inputs}


async def decide(ctx: Any, study_id: str) -> dict[str, Any]:
    """STUDY-6: apply the pre-registered rule, close the study and store the record (verdict,
    every figure, the registration hash, the reviewers' count, never their names). A study
    decided already returns its record unchanged."""
    held = await db.get_decision(ctx.pool, study_id)
    if held is not None:
        return held
    row, _, result, inputs = await _figures(ctx, study_id)
    if row.registration_hash is None:
        raise StudyNotRunning(f"study {study_id!r} has not started: there is nothing to decide")
    await db.close_study(ctx.pool, study_id)
    row, study, result, inputs = await _figures(ctx, study_id)  # the votes as of the close
    return await db.save_decision(ctx.pool, study_id, _record(study_id, row, study, result, inputs))


async def adopt(ctx: Any, study_id: str) -> dict[str, Any]:
    """STUDY-6: make a writer-mode study's decision this deployment's default writerMode: the
    winning arm's mode, `inline` when the verdict is undecided."""
    record = await db.get_decision(ctx.pool, study_id)
    if record is None:
        raise DecisionMissing(f"study {study_id!r} has no decision: run `novelbus study decide {study_id}` first")
    _, study = await _study(ctx, study_id)
    if study.file.variable != "writerMode":
        raise VoteRefused(f"study {study_id!r} tests {study.file.variable!r}, not writerMode: there is no default "
                          "writerMode to adopt from it")
    verdict = record["verdict"]
    mode = study.arm_configs[verdict].writerMode if verdict in study.arm_configs else "inline"
    await db.adopt(ctx.pool, study_id, mode)
    return {"studyId": study_id, "verdict": verdict, "writerMode": mode}


async def default_writer_mode(ctx: Any) -> dict[str, Any]:
    """The writerMode a novel file silent on it gets here, and the decision it follows: the
    latest adopted one, else the decision record the release ships (`novel.w3`)."""
    from novelbus.novel import w3

    adopted = await db.current_adoption(ctx.pool)
    if adopted is None:
        return {"writerMode": w3.DEFAULT_WRITER_MODE, "source": "shipped", "studyId": w3.DECISION["studyId"],
                "verdict": w3.DECISION["verdict"], "registrationHash": w3.DECISION["registrationHash"],
                "note": w3.followed(w3.DEFAULT_WRITER_MODE, w3.DECISION, source="shipped")}
    study_id, mode, record = adopted
    return {"writerMode": mode, "source": "adopted", "studyId": study_id, "verdict": record["verdict"],
            "registrationHash": record["registrationHash"], "note": w3.followed(mode, record, source="adopted")}


# --- the reviewer's -------------------------------------------------------------------------------


async def authenticate(ctx: Any, study_id: str, token: str) -> db.ReviewerRow:
    """The reviewer a token stands for in this study (a person's invite, or the session it was
    redeemed for). Raises StudyNotFound, StudyClosed (reviewing is over) or ReviewerRefused."""
    row = await db.get_study(ctx.pool, study_id)
    if row.status == "closed":
        raise StudyClosed(f"study {study_id!r} is closed: it takes no more votes")
    reviewer = await db.reviewer_by_token(ctx.pool, study_id, token_hash(token))
    if reviewer.kind != "person":
        raise ReviewerRefused("this token is not a reviewer's")
    return reviewer


async def redeem_invite(ctx: Any, study_id: str, token: str) -> str:
    """The panel's one-time link: the invite token exchanged for a session token (returned;
    stored hashed). The invite is refused from then on (a replay)."""
    row = await db.get_study(ctx.pool, study_id)
    if row.status == "closed":
        raise StudyClosed(f"study {study_id!r} is closed")
    session = secrets.token_urlsafe(24)
    await db.redeem(ctx.pool, study_id, token_hash(token), token_hash(session))
    return session


async def next_pair(ctx: Any, study_id: str, token: str) -> dict[str, Any]:
    """STUDY-3: the reviewer's next pair (the first, in its own order, with a criterion it has
    not voted on): {pairId, criteria (names), questions, context, a, b, progress}, or
    {done: true, progress}. Blind: nothing else."""
    reviewer = await authenticate(ctx, study_id, token)
    _, study = await _study(ctx, study_id)
    ready = {p.pair_id: p for p in _reviewable(await refresh_pairs(ctx, study_id))}
    voted = {(v.pair_id, v.criterion) for v in await db.effective_votes(ctx.pool, study_id, reviewer.alias)}
    order = reviewer_order(list(ready), seed=study.file.seed, reviewer_index=reviewer.reviewer_index)
    criteria = list(study.file.criteria)
    left = [p for p in order if any((p, c) not in voted for c in criteria)]
    progress = {"done": len(order) - len(left), "total": len(order)}
    if not left:
        return {"done": True, "progress": progress}
    pair = ready[left[0]]
    a, b = _letters(pair, a_shows_test(study.file.seed, pair.pair_index, reviewer.reviewer_index))
    return {"pairId": pair.pair_id, "criteria": criteria,
            "questions": {c: QUESTIONS.get(c, c.replace("_", " ")) for c in criteria},
            "voted": sorted(c for c in criteria if (pair.pair_id, c) in voted),
            "context": pair.context, "a": a, "b": b, "progress": progress,
            "choices": list(CHOICES), "flagCategories": list(FLAG_CATEGORIES)}


async def vote(ctx: Any, study_id: str, pair_id: str, token: str, *, criterion: str, choice: str,
               flag: str | None = None, span: tuple[int, int] | None = None, text: str | None = None) -> dict[str, Any]:
    """STUDY-3 / STUDY-8: one vote on one criterion of one pair, optionally flagging a problem
    (a ConStory category and a span [start, end) of text a or b, in characters of that text).
    Every input is checked before anything is written; a repeated submit writes nothing
    (`recorded: false`), a changed one supersedes. Returns {pairId, criterion, recorded}."""
    reviewer = await authenticate(ctx, study_id, token)
    row, study = await _study(ctx, study_id)
    if row.status != "running":
        raise StudyNotRunning(f"study {study_id!r} has not started: no pair is open for review")
    pair = next((p for p in await db.list_pairs(ctx.pool, study_id) if p.pair_id == pair_id), None)
    if pair is None or pair not in _reviewable([pair]):
        raise PairNotFound(f"pair {pair_id[:40]!r} is not a pair of this study open for review")
    if criterion not in study.file.criteria:
        raise VoteRefused(f"criterion {criterion[:40]!r} is not registered for this study "
                          f"(one of: {', '.join(study.file.criteria)})")
    if choice not in CHOICES:
        raise VoteRefused(f"choice {choice[:20]!r} is not one of: {', '.join(CHOICES)}")
    a_is_test = a_shows_test(study.file.seed, pair.pair_index, reviewer.reviewer_index)
    if flag is None and (span is not None or text is not None):
        raise VoteRefused("--span and --text describe a flag: give --flag CATEGORY too")
    if flag is not None:
        if flag not in FLAG_CATEGORIES:
            raise VoteRefused(f"flag {flag[:40]!r} is not a category (one of: {', '.join(FLAG_CATEGORIES)})")
        if text not in ("a", "b"):
            raise VoteRefused("a flag names the text it is in: a or b")
        if span is None:
            raise VoteRefused("a flag needs the span START:END of the problem in that text")
        length = len(_letters(pair, a_is_test)[0 if text == "a" else 1])
        start, end = span
        if not 0 <= start < end <= length:
            raise VoteRefused(f"span {start}:{end} is outside text {text} (its characters are 0:{length}, "
                              "the end exclusive)")
    recorded = await db.record_vote(ctx.pool, study_id, VoteRow(
        reviewer.alias, "person", pair.pair_id, criterion, choice, a_is_test, flag, text if flag else None,
        span[0] if flag and span else None, span[1] if flag and span else None))
    return {"pairId": pair.pair_id, "criterion": criterion, "recorded": recorded}


__all__ = [
    "DEFAULT_PANEL_URL", "Judge", "adopt", "authenticate", "create", "create_arm", "decide", "default_writer_mode", "invite",
    "judge", "judge_usage_novel", "next_pair", "redeem_invite", "refresh_pairs", "report", "start", "status",
    "token_hash", "vote",
]
