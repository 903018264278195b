#!/usr/bin/env python3
"""An external planner for novelbus (PLAN-3), built on nats-py and the public JSON Schema only.

It does not import novelbus. Everything it knows about the service comes from the bus and from
the schema that `novelbus schema --out schema.json` prints: the subjects
(`novel.events.<novelId>.<type>`, `novelbus.cmd.steer`), the message types and their fields.
Every request it sends is checked against that schema first.

What it does, for one novel, until the novel finishes:

- it listens for `outline.requested` (the novel paused `awaiting-outline`: no chapters, a
  chapter without scenes, a requirement pending, or the next planned chapter) and for
  `requirement.received` (a user directive);
- it reads the planner's view (`steer.planning`: the planner role's projection of the novel —
  story, cast, every chapter and scene with its state, foreshadowing, recent canon summaries;
  never prose, nothing committed after it) and the requirements ledger (`steer.requirements`),
  writes what is missing — the next chapter with its scenes, or scenes for an empty chapter — and
  applies every pending directive by citing its id;
- it submits the revision with compare-and-set (`expectedRevision`); on `revision-conflict`
  (somebody else revised first) it reads the outline again and plans afresh, on `unit-in-flight`
  it waits and retries.

Offline (the default) the chapter is written deterministically from the outline. With a model
(`--model NAME`, or NOVELBUS_PLANNER_MODEL, at NOVELBUS_MODEL_BASE_URL, key in
NOVELBUS_MODEL_API_KEY) it asks an OpenAI-compatible chat-completions server for the chapter as
JSON and falls back to the deterministic plan if the answer does not fit.

It prints one line per action with ids and counts only — never outline text or directive text.

    python examples/planner.py NOVEL --nats-url nats://127.0.0.1:4222 --schema schema.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

import nats

SCHEMA_VERSION = "1"


class SteerError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Schema:
    """The public JSON Schema: find a message definition by its `type` tag and check a message."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.defs: dict[str, Any] = doc.get("$defs", {})
        self.by_tag: dict[str, dict[str, Any]] = {}
        for d in self.defs.values():
            tag = d.get("properties", {}).get("type", {}).get("enum", [None])[0]
            if tag:
                self.by_tag[tag] = d

    def check(self, msg: dict[str, Any]) -> None:
        d = self.by_tag.get(msg.get("type", ""))
        if d is None:
            raise ValueError(f"message type {msg.get('type')!r} is not in the schema")
        self._check(msg, d, msg["type"])

    def _resolve(self, d: dict[str, Any]) -> dict[str, Any]:
        ref = d.get("$ref")
        return self.defs[ref.rsplit("/", 1)[1]] if ref else d

    def _check(self, value: Any, d: dict[str, Any], where: str) -> None:
        d = self._resolve(d)
        if "anyOf" in d:
            errors = []
            for option in d["anyOf"]:
                try:
                    self._check(value, option, where)
                    return
                except ValueError as e:
                    errors.append(str(e))
            raise ValueError(f"{where}: fits none of the allowed shapes ({'; '.join(errors)})")
        kind = d.get("type")
        if kind == "object":
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected an object")
            props = d.get("properties", {})
            for name in d.get("required", []):
                if name not in value:
                    raise ValueError(f"{where}: missing {name}")
            if d.get("additionalProperties") is False:
                extra = set(value) - set(props)
                if extra:
                    raise ValueError(f"{where}: unknown fields {sorted(extra)}")
            for name, v in value.items():
                if name in props:
                    self._check(v, props[name], f"{where}.{name}")
        elif kind == "array":
            if not isinstance(value, list):
                raise ValueError(f"{where}: expected an array")
            for i, item in enumerate(value):
                self._check(item, d.get("items", {}), f"{where}[{i}]")
        elif kind == "string" and not isinstance(value, str):
            raise ValueError(f"{where}: expected a string")
        elif kind == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{where}: expected an integer")
        elif kind == "null" and value is not None:
            raise ValueError(f"{where}: expected null")
        if "enum" in d and value not in d["enum"]:
            raise ValueError(f"{where}: {value!r} is not one of {d['enum']}")


class Planner:
    def __init__(self, nc: Any, schema: Schema, novel_id: str, *, namespace: str = "", model: str | None = None,
                 name: str = "planner", scenes_per_chapter: int | None = None, timeout: float = 30.0) -> None:
        self.nc, self.schema, self.novel_id = nc, schema, novel_id
        self.namespace, self.model, self.name = namespace, model, name
        self.scenes_per_chapter = scenes_per_chapter
        self.timeout = timeout
        self.steer_subject = f"{namespace}novelbus.cmd.steer"
        self.lock = asyncio.Lock()
        self.finished = asyncio.Event()
        self.revisions = 0
        self.conflicts = 0

    def log(self, line: str) -> None:
        print(f"{self.name}: {line}", flush=True)

    # --- the bus ---------------------------------------------------------------------------
    async def request(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        self.schema.check(msg)  # nothing leaves that the service's schema does not describe
        headers = {"Novelbus-Type": msg["type"], "Novelbus-Schema": SCHEMA_VERSION}
        reply = await self.nc.request(self.steer_subject, json.dumps(msg).encode(), timeout=timeout or self.timeout,
                                      headers=headers)
        answer: dict[str, Any] = json.loads(reply.data)
        if answer.get("type") == "error":
            raise SteerError(answer.get("code", "error"), answer.get("message", ""))
        return answer

    async def planning(self) -> dict[str, Any]:
        """The planner's view (ROLE-4): `projection` is all it plans from; `revision`, `status`,
        `awaiting` and `nextChapterOrder` are the handles to act on it."""
        return await self.request({"type": "steer.planning", "novelId": self.novel_id})

    async def ledger(self) -> dict[str, Any]:
        return await self.request({"type": "steer.requirements", "novelId": self.novel_id})

    async def on_event(self, msg: Any) -> None:
        event = json.loads(msg.data)
        kind = event.get("type")
        if kind == "novel.finished":
            self.log("novel finished")
            self.finished.set()
        elif kind in ("outline.requested", "requirement.received"):
            self.log(f"{kind} ({event.get('why') or event.get('requirementId')})")
            asyncio.ensure_future(self.plan())

    # --- planning --------------------------------------------------------------------------
    async def plan(self) -> None:
        """Read, write what is missing, submit with compare-and-set; on a conflict start over."""
        async with self.lock:
            for _ in range(50):
                state = await self.planning()
                if state["status"] == "finished":
                    self.finished.set()
                    return
                ledger = await self.ledger()
                pending = [r for r in ledger["requirements"] if r["status"] == "pending"]
                layers = self.next_layers(state, pending)
                if layers is None and not pending:
                    return  # nothing to plan (yet)
                updates = [{"requirementId": r["requirementId"], "status": "applied"} for r in pending]
                msg = {"type": "steer.revise", "novelId": self.novel_id, "expectedRevision": state["revision"],
                       "reason": f"{self.name}: " + ("next chapter" if layers else "directives"),
                       "layers": layers or {}, "requirements": updates, "holdMs": 10_000}
                try:
                    revised = await self.request(msg, timeout=self.timeout + 10)
                except SteerError as e:
                    if e.code == "revision-conflict":  # somebody revised first: read again, plan afresh
                        self.conflicts += 1
                        self.log(f"conflict on {state['revision']}; planning again")
                        continue
                    if e.code in ("unit-in-flight", "bus-unavailable"):
                        await asyncio.sleep(0.2)
                        continue
                    raise
                self.revisions += 1
                self.log(f"revision {revised['revision']} (#{revised['seq']}): {revised['chapters']} chapters, "
                         f"{revised['scenes']} scenes, applied {len(revised['applied'])}"
                         + (", resumed" if revised["resumed"] else ""))
                return
            self.log("gave up after 50 attempts")

    def next_layers(self, state: dict[str, Any], pending: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The layers to replace: a new chapter (with scenes) when the novel waits for one, scenes for
        an empty chapter, and every pending directive noted in the chapter it shapes."""
        o = outline_of(state["projection"])
        chapters: list[dict[str, Any]] = list(o.get("chapters", []))
        scenes: list[dict[str, Any]] = list(o.get("scenes", []))
        awaiting = state.get("awaiting")  # what the novel waits for: the `why` of outline.requested
        empty = [c for c in sorted(chapters, key=lambda c: c["order"])
                 if not any(s["chapterId"] == c["chapterId"] for s in scenes)]
        target: dict[str, Any] | None = None
        if empty:
            target = empty[0]
        elif awaiting in ("next-chapter", "no-chapters", "no-outline"):
            target = self.new_chapter(o, chapters, state.get("nextChapterOrder"))
            chapters.append(target)
        if target is None and not pending:
            return None
        if pending:  # the directives shape the chapter being planned, or the last one
            holder = target or max(chapters, key=lambda c: c["order"])
            notes = [f"Directive {r['requirementId']}: {r['text'][:300]}" for r in pending]
            updated = dict(holder, keyEvents=list(holder.get("keyEvents", [])) + notes)
            chapters = [updated if c["chapterId"] == holder["chapterId"] else c for c in chapters]
            target = updated if target is not None else None
        if target is not None and not any(s["chapterId"] == target["chapterId"] for s in scenes):
            scenes += self.new_scenes(o, target, len(chapters), pending)
        return {"chapters": chapters, "scenes": scenes}

    def new_chapter(self, o: dict[str, Any], chapters: list[dict[str, Any]],
                    order: int | None = None) -> dict[str, Any]:
        order = order or max((c["order"] for c in chapters), default=0) + 1
        ids = {c["chapterId"] for c in chapters}
        chapter_id, n = f"ch{order:03d}", 1
        while chapter_id in ids:
            n += 1
            chapter_id = f"ch{order:03d}-{n}"
        story = o.get("story", {})
        plan = self.model_chapter(o, order) if self.model else None
        return {"chapterId": chapter_id, "order": order,
                "title": (plan or {}).get("title") or f"Chapter {order}",
                "purpose": (plan or {}).get("purpose")
                or f"Carry the conflict ({story.get('mainConflict') or story.get('premise', '')[:120]}) one step "
                   f"further toward the ending: {story.get('endingDirection', '')[:160]}",
                "entryCondition": "", "exitCondition": "", "keyEvents": []}

    def cast(self, o: dict[str, Any]) -> list[str]:
        """Characters that already take part in scenes (so every writer pack covers them)."""
        seen: list[str] = []
        for s in o.get("scenes", []):
            for p in s.get("participants", []):
                if p not in seen:
                    seen.append(p)
        return seen or [c["characterId"] for c in o.get("characters", [])][:3]

    def new_scenes(self, o: dict[str, Any], chapter: dict[str, Any], n_chapters: int,
                   pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
        existing = [s for s in o.get("scenes", [])]
        per = self.scenes_per_chapter or max(1, min(4, round(len(existing) / max(1, n_chapters - 1))))
        cast = self.cast(o)
        names = {c["characterId"]: c.get("name", c["characterId"]) for c in o.get("characters", [])}
        ids = {s["sceneId"] for s in existing}
        out = []
        for i in range(1, per + 1):
            who = [cast[(chapter["order"] + i + k) % len(cast)] for k in range(min(2, len(cast)))] if cast else []
            who = list(dict.fromkeys(who))
            scene_id = f"{chapter['chapterId']}s{i:02d}"
            while scene_id in ids:
                scene_id += "x"
            goal = (f"{' and '.join(names.get(w, w) for w in who) or 'The protagonists'} follow the trail"
                    f" through part {chapter['order']}, step {i}.")
            if pending and i == 1:
                goal += " They act on the new direction they were given."
            out.append({"sceneId": scene_id, "chapterId": chapter["chapterId"], "order": i, "goal": goal,
                        "participants": who})
        return out

    def model_chapter(self, o: dict[str, Any], order: int) -> dict[str, Any] | None:
        """Ask a chat-completions server for the chapter's title and purpose as JSON; None if unusable."""
        base = os.environ.get("NOVELBUS_MODEL_BASE_URL", "http://127.0.0.1:8000/v1").rstrip("/")
        key = os.environ.get("NOVELBUS_MODEL_API_KEY") or os.environ.get("OPENAI_API_KEY") or ""
        story = o.get("story", {})
        titles = [c.get("title", "") for c in sorted(o.get("chapters", []), key=lambda c: c["order"])]
        prompt = ("You plan a novel chapter by chapter. Story: " + json.dumps(story, ensure_ascii=False)
                  + ". Chapters so far: " + json.dumps(titles, ensure_ascii=False)
                  + f". Plan chapter {order}. Answer with JSON only: {{\"title\": str, \"purpose\": str}}.")
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": prompt}],
                           "temperature": 0.7}).encode()
        req = urllib.request.Request(f"{base}/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - the configured server
                text = json.loads(resp.read())["choices"][0]["message"]["content"]
            start, end = text.find("{"), text.rfind("}")
            plan = json.loads(text[start:end + 1])
            if isinstance(plan.get("title"), str) and isinstance(plan.get("purpose"), str):
                return {"title": plan["title"][:120], "purpose": plan["purpose"][:300]}
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError):
            pass
        self.log("model answer unusable; planning offline")
        return None

    # --- running ---------------------------------------------------------------------------
    async def run(self, until_finished: bool = True) -> None:
        subject = f"{self.namespace}novel.events.{self.novel_id}.>"
        sub = await self.nc.subscribe(subject, cb=self.on_event)
        try:
            await self.plan()  # the novel may already be waiting
            if until_finished:
                await self.finished.wait()
        finally:
            await sub.unsubscribe()


CHAPTER_FIELDS = ("chapterId", "order", "title", "purpose", "entryCondition", "exitCondition", "keyEvents")
SCENE_FIELDS = ("sceneId", "order", "goal", "participants", "timeLocation", "causality", "conflict",
                "expectedChange", "continuationAnchor")


def outline_of(view: dict[str, Any]) -> dict[str, Any]:
    """The outline layers a revision replaces, read back from the planner's view (its chapters
    nest their scenes and carry each one's state, which are not outline fields)."""
    chapters = [{k: c[k] for k in CHAPTER_FIELDS if k in c} for c in view.get("chapters", [])]
    scenes = [{"chapterId": c["chapterId"], **{k: s[k] for k in SCENE_FIELDS if k in s}}
              for c in view.get("chapters", []) for s in c.get("scenes", [])]
    return {"story": view.get("story") or {}, "characters": view.get("characters", []),
            "chapters": chapters, "scenes": scenes}


def load_schema(path: str | None) -> Schema:
    if not path:
        raise SystemExit("planner: --schema FILE is required (write it with `novelbus schema --out FILE`)")
    with open(path, encoding="utf-8") as f:
        return Schema(json.load(f))


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("novel_id")
    ap.add_argument("--nats-url", default=os.environ.get("NOVELBUS_NATS_URL", "nats://127.0.0.1:4222"))
    ap.add_argument("--schema", default=os.environ.get("NOVELBUS_SCHEMA"), help="`novelbus schema --out` file")
    ap.add_argument("--namespace", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=os.environ.get("NOVELBUS_PLANNER_MODEL"))
    ap.add_argument("--name", default="planner")
    ap.add_argument("--scenes", type=int, default=None, help="scenes per new chapter (default: the outline's average)")
    args = ap.parse_args()
    schema = load_schema(args.schema)
    nc = await nats.connect(args.nats_url, name=args.name, max_reconnect_attempts=-1)
    try:
        planner = Planner(nc, schema, args.novel_id, namespace=args.namespace, model=args.model, name=args.name,
                          scenes_per_chapter=args.scenes)
        await planner.run()
        planner.log(f"done: {planner.revisions} revisions, {planner.conflicts} conflicts")
    finally:
        await nc.drain()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
