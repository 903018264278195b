"""OPS-2 + PLAN-1/4/5: the panel's steering API over plain HTTP, against the running driver on real
NATS + PostgreSQL: CSRF on every steering POST, a stale revision refused naming the current one,
bad layers / values / directives refused naming the field with nothing changed, a directive's
text kept out of events, and a clear word when no driver serves `novelbus.cmd.steer`."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any
from urllib.parse import urlencode

from novelbus import store
from novelbus.app import actions
from novelbus.bench.generate import generate_novel_file
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from novelbus.panel.serve import PanelOptions, panel_server
from tests.e2e.test_steering import chapter, scene
from tests.panel.conftest import Panel
from tests.panel.test_panel_http import _novel, csrf_of, http
from tests.waiting import novel_stopped, wait_until


def _multipart(fields: dict[str, str], file: tuple[str, bytes] | None = None) -> tuple[bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    if file is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{file[0]}"\r\n'
                     f"Content-Type: application/json\r\n\r\n".encode() + file[1] + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), {
        "Content-Type": f"multipart/form-data; boundary={boundary}"}


async def test_revise_from_the_panel_cas_field_errors_and_csrf(panel: Panel) -> None:
    """OPS-2, PLAN-1"""
    pool = panel.rt.ctx.pool
    novel_id = await _novel(panel, start=False)
    await store.pause_novel(pool, novel_id, "user-request")
    base = f"{panel.url}api/novels/{novel_id}"
    csrf = {"X-CSRF-Token": await csrf_of(panel.url)}
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    status, _, body = await http(base + "/steering")
    steering = json.loads(body)
    first = steering["outline"]["revision"]
    assert status == 200 and first == (await store.get_novel(pool, novel_id)).outline_revision
    assert [r["revision"] for r in steering["revisions"]["revisions"]] == [first]
    assert steering["requirements"] == {"novelId": novel_id, "watermark": 0, "requirements": []}
    assert steering["config"]["budgets"]["maxTurns"] == 200
    outline = steering["outline"]["outline"]

    # Every steering POST needs the CSRF token; without it nothing happens.
    story = {"story": outline["story"] | {"premise": "A premise set from the panel."}}
    for path, payload in (("/revise", urlencode({"layers": json.dumps(story), "expect": first}).encode()),
                          ("/direct", b'{"text": "More rain."}'), ("/config", b'{"set": {"budgets.maxTurns": 9}}')):
        assert (await http(base + path, "POST", payload, form))[0] == 403
    assert (await http(base + "/revise"))[0] == 405
    assert len(await store.list_revisions(pool, novel_id)) == 1
    assert (await store.list_requirements(pool, novel_id))[0] == []

    # Bad layers: refused naming the field (the CLI's words), nothing written.
    for layers, field, words in (
            ("{nope", "layers", "not valid JSON: line 1 column 2"),
            ("[1, 2]", "layers", "expected an object of outline layers"),
            ('{"scenes": [{"sceneId": "z", "chapterId": "ch009", "order": 1, "goal": "g"}]}',
             "scenes[0].chapterId", "unknown chapter 'ch009'"),
            ('{"villains": []}', "layers", "unknown layers ['villains']")):
        status, _, body = await http(base + "/revise", "POST", urlencode({"layers": layers, "expect": first}).encode(),
                                     form | csrf)
        reply = json.loads(body)
        assert status == 422, (layers, reply)
        assert {e["field"] for e in reply["errors"]} == {field} and words in reply["errors"][0]["message"], reply
    status, _, body = await http(base + "/revise", "POST", urlencode({"expect": first}).encode(), form | csrf)
    assert status == 422 and "nothing given" in body.decode()
    assert (await store.get_novel(pool, novel_id)).outline_revision == first

    # An uploaded file, wrapped like a novel file's outline: the revision goes through.
    payload, headers = _multipart({"expect": first, "reason": "new premise"},
                                  ("layers.json", json.dumps({"outline": story}).encode()))
    status, _, body = await http(base + "/revise", "POST", payload, headers | csrf)
    revised = json.loads(body)
    assert status == 200 and revised["parent"] == first, revised
    second = revised["revision"]
    assert (await store.get_novel(pool, novel_id)).outline_revision == second
    assert [e.type for e in await store.list_events(pool, novel_id)][-1] == "outline.revised"

    # A stale expected revision: 409, the current revision named; nothing changed.
    status, _, body = await http(base + "/revise", "POST", urlencode(
        {"layers": json.dumps({"story": outline["story"]}), "expect": first}).encode(), form | csrf)
    reply = json.loads(body)
    assert status == 409 and reply["code"] == "revision-conflict" and reply["currentRevision"] == second
    assert reply["errors"][0]["field"] == "expect" and second in reply["errors"][0]["message"]
    assert len(await store.list_revisions(pool, novel_id)) == 2


async def test_directives_and_config_from_the_panel(panel: Panel) -> None:
    """OPS-2, PLAN-4, PLAN-5"""
    pool = panel.rt.ctx.pool
    novel_id = await _novel(panel, start=False)
    await store.pause_novel(pool, novel_id, "user-request")
    base = f"{panel.url}api/novels/{novel_id}"
    csrf = {"X-CSRF-Token": await csrf_of(panel.url), "Content-Type": "application/json"}
    text = "Keep the lighthouse dark until the last chapter."

    async def post(path: str, body: Any) -> tuple[int, Any]:
        status, _, raw = await http(base + path, "POST", json.dumps(body).encode(), csrf)
        return status, json.loads(raw)

    for body, field, said in (({"text": "  "}, "text", "must not be empty"),
                              ({"text": 5}, "text", "must be a string"),
                              ({"text": text, "messageId": "bad id!"}, "messageId", "")):
        status, reply = await post("/direct", body)
        assert status == 422 and [e["field"] for e in reply["errors"]] == [field], reply
        assert said in reply["errors"][0]["message"]
    for _ in range(2):  # the same message twice: one requirement
        status, reply = await post("/direct", {"text": text, "messageId": "m-panel-1"})
        assert status == 200 and (reply["requirementId"], reply["status"]) == ("req-1", "pending"), reply
    assert reply["duplicate"] is True
    status, reply = await post("/direct", {"text": "Something else.", "messageId": "m-panel-1"})
    assert status == 409 and reply["errors"][0]["field"] == "messageId" and "Something" not in json.dumps(reply)
    status, reply = await post("/direct", {"text": "No id given: the panel makes one."})
    assert status == 200 and reply["requirementId"] == "req-2" and reply["messageId"].startswith("panel-")
    ledger, _ = await store.list_requirements(pool, novel_id)
    assert [(r.requirement_id, r.status, r.text) for r in ledger] == [
        ("req-1", "pending", text), ("req-2", "pending", "No id given: the panel makes one.")]
    events = await store.list_events(pool, novel_id)
    assert [e.type for e in events].count("requirement.received") == 2
    assert not [e for e in events if "lighthouse" in json.dumps(e.payload)]  # ids, sizes and hashes only

    # Config: invalid values named by field, never clamped; nothing changes on error.
    for changes, field in (({"budgets.maxTurns": "-3"}, "budgets.maxTurns"),
                           ({"budgets.maxTurns": "lots"}, "budgets.maxTurns"),
                           ({"budgets.maxTurnz": "5"}, "budgets.maxTurnz"),
                           ({"budgets.maxTurns": "50", "budgets.writerDispatchLimit": "99"},
                            "budgets.writerDispatchLimit")):
        status, reply = await post("/config", {"set": changes})
        assert status == 422 and field in [e["field"] for e in reply["errors"]], reply
    status, reply = await post("/config", {"set": {}})
    assert status == 422 and "nothing to change" in reply["errors"][0]["message"]
    status, reply = await post("/config", {"set": 5})  # not "nothing to change": the wrong shape
    assert status == 422 and reply["errors"][0]["field"] == "set" and "must be an object" in reply["errors"][0]["message"]
    assert (await store.get_novel(pool, novel_id)).config.budgets.maxTurns == 200
    status, reply = await post("/config", {"set": {"budgets.maxTurns": "400", "writerShape": "W1"}})
    assert status == 200 and reply["changed"] == ["budgets.maxTurns", "writerShape"], reply
    novel = await store.get_novel(pool, novel_id)
    assert (novel.config.budgets.maxTurns, novel.config.writerShape) == (400, "W1")
    assert [e.type for e in await store.list_events(pool, novel_id)][-1] == "novel.config-changed"

    status, _, raw = await http(f"{panel.url}api/novels/n-nope/steering")
    assert status == 404 and b"not found" in raw


async def test_steering_without_a_driver_says_so(panel: Panel) -> None:
    """OPS-2: A panel on subjects nobody serves (no driver running): 503 with what to start."""
    novel_id = await _novel(panel, start=False)
    lonely = dataclasses.replace(panel.rt.ctx, subjects=Subjects(panel.rt.ctx.subjects.namespace + "x"))
    async with panel_server(lonely, PanelOptions(port=0)) as url:
        status, _, raw = await http(f"{url}api/novels/{novel_id}/steering")
        assert status == 503 and b"novelbus up" in raw
        csrf = {"X-CSRF-Token": await csrf_of(url), "Content-Type": "application/json"}
        status, _, raw = await http(f"{url}api/novels/{novel_id}/config", "POST",
                                    b'{"set": {"budgets.maxTurns": 9}}', csrf)
        assert status == 503 and b"no driver answers" in raw
    assert (await store.get_novel(panel.rt.ctx.pool, novel_id)).config.budgets.maxTurns == 200


async def test_revise_a_running_novel_from_the_panel(panel: Panel) -> None:
    """OPS-2, PLAN-1: A novel being written gets a chapter from the panel (held while a unit is claimed, PLAN-1)
    and finishes with it: the revision is in the ledger before `novel.finished`."""
    ctx = panel.rt.ctx
    data = generate_novel_file(1, 6, seed=2, unit_chars=300)
    data["config"]["writerMode"] = "inline"
    novel_id = await actions.create(ctx, NovelFile.model_validate(data))
    async def running_now() -> bool:  # its first unit is committed
        return bool((await store.get_novel(ctx.pool, novel_id)).turns >= 1)

    await wait_until(running_now, 30, "the novel's first commit")
    base = f"{panel.url}api/novels/{novel_id}"
    _, _, body = await http(base + "/steering")
    state = json.loads(body)["outline"]
    assert state["status"] == "active", state["status"]
    o = state["outline"]
    layers = {"chapters": o["chapters"] + [chapter(2, "Added While Running")],
              "scenes": o["scenes"] + [scene(2, 1, o["scenes"][0]["participants"])]}
    csrf = {"X-CSRF-Token": await csrf_of(panel.url), "Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = await http(base + "/revise", "POST", urlencode(
        {"layers": json.dumps(layers), "expect": state["revision"], "reason": "one more chapter"}).encode(), csrf)
    revised = json.loads(body)
    assert status == 200 and (revised["chapters"], revised["scenes"]) == (2, 7), revised
    await novel_stopped(ctx.pool, novel_id, 60)
    snap = await store.load_snapshot(ctx.pool, novel_id, prose=False)
    assert snap.status == "finished" and {c.chapter_id for c in snap.commits} == {"ch001", "ch002"}
    types = [e.type for e in await store.list_events(ctx.pool, novel_id)]
    assert types.index("outline.revised") < types.index("novel.finished")
