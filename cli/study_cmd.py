"""`novelbus study create|start|run|status|invite|judge|report|decide|adopt` (STUDY-1..6).

Thin: every command calls `app.studies`, the same services the panel calls, and turns a store
error into exit 2 with its stable code (STUDY-8).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from novelbus import store
from novelbus.actors.runtime import connected
from novelbus.app import studies
from novelbus.cli.common import (
    COMMAND_NATS_WAIT_S,
    console,
    err_console,
    fail,
    print_json,
    read_input,
    run,
    servers,
    write_output,
)
from novelbus.messages.subjects import Subjects
from novelbus.novel.study import StudyError, parse_study_file

T = TypeVar("T")

study_app = typer.Typer(no_args_is_help=True, help="Pre-registered studies: arms, blind review by people, the decision.")

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME, default ./.novelbus)")]
NatsOpt = Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server (env NOVELBUS_NATS_URL)")]
DbOpt = Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")]
NsOpt = Annotated[str, typer.Option("--namespace", hidden=True, help="Subject namespace prefix (tests)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object")]

HINTS = {
    "study-not-found": "`novelbus study list` shows the studies",
    "study-closed": "a decided study is closed; its report and decision stay readable",
    "reviewer-refused": "ask the operator for an invite: `novelbus study invite STUDY --reviewer NAME`",
    "pair-not-found": "`novelbus review next STUDY --reviewer-token T` gives the next pair",
    "decision-missing": "`novelbus study decide STUDY` applies the registered rule",
}


def call(home: Path | None, nats_url: str | None, database_url: str | None, namespace: str,
         fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run `fn(ctx)` against the servers; a store error exits 2 naming what is wrong."""
    async def go() -> T:
        async with servers(home, nats_url, database_url, announce=False) as ep:
            async with connected(ep.nats_url, ep.database_url, subjects=Subjects(namespace), name="novelbus-cli",
                                 nats_wait=COMMAND_NATS_WAIT_S) as ctx:
                return await fn(ctx)

    try:
        return run(go())
    except store.StoreError as e:
        fail(escape(f"{e.code}: {e}"), hint=HINTS.get(e.code), code=2)


@study_app.command("create")
def create(file: Annotated[Path, typer.Argument(help="Study file (JSON): novel, arms, variable, rule")],
           home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
           start: Annotated[bool, typer.Option(help="Freeze the registration and start the arms now")] = True,
           as_json: JsonOpt = False) -> None:
    """Register a study; bad files get an error naming the field (STUDY-1, STUDY-8). With --start
    (the default) the registration is frozen and hashed and each arm's novel is created and
    started: `novelbus up` (or `novelbus study run ID`) writes them."""
    base = file.resolve().parent

    def load(path: str) -> bytes:
        return (base / path).read_bytes()

    try:
        study = parse_study_file(read_input(file), load)
    except StudyError as e:
        fail(escape(f"{file}: {e}"), code=2)
    study_id = call(home, nats_url, database_url, namespace, lambda ctx: studies.create(ctx, study, start_arms=start))
    if as_json:
        print_json({"studyId": study_id})
        return
    console.print(study_id)
    if start:
        err_console.print(f"[dim]arms {', '.join(study.file.arms)} started; `novelbus study status {study_id}` "
                          "shows their progress[/]")


@study_app.command("start")
def start(study_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
          namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """Freeze a registered study and start its arms (STUDY-1)."""
    held = call(home, nats_url, database_url, namespace, lambda ctx: studies.start(ctx, study_id))
    if as_json:
        print_json({"studyId": study_id, "registrationHash": held})
    else:
        console.print(f"{study_id}: registration {held}")


@study_app.command("run")
def run_arms(study_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
             namespace: NsOpt = "", model: Annotated[str, typer.Option("--model", envvar="NOVELBUS_MODEL",
                                                                     help="Writer provider")] = "offline",
             timeout: Annotated[float, typer.Option(min=1, help="Give up after this many seconds")] = 900.0) -> None:
    """Run the actors in this process until every arm of the study has finished or paused (for
    a deployment without `novelbus up`)."""
    from novelbus.actors.context import Settings
    from novelbus.actors.runtime import running

    async def go() -> dict[str, Any]:
        async with servers(home, nats_url, database_url, announce=False) as ep:
            async with running(ep.nats_url, ep.database_url, subjects=Subjects(namespace),
                               settings=Settings(model=model)) as rt:
                await studies.start(rt.ctx, study_id)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                while True:
                    status = await studies.status(rt.ctx, study_id)
                    if all(a["status"] != "active" for a in status["arms"].values()):
                        return status
                    if loop.time() > deadline:
                        fail(f"the arms of {study_id} did not finish within {timeout:.0f} s")
                    await asyncio.sleep(1.0)

    try:
        status = run(go())
    except store.StoreError as e:
        fail(escape(f"{e.code}: {e}"), hint=HINTS.get(e.code), code=2)
    for arm, info in status["arms"].items():
        console.print(f"{arm:<16} {info['status']:<9} {info['commits']} commits")
    console.print(f"pairs ready for review: {status['pairs']}")


@study_app.command("list")
def list_studies(home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
                 namespace: NsOpt = "") -> None:
    """List the studies with their status."""
    rows = call(home, nats_url, database_url, namespace, lambda ctx: store_list(ctx))
    for study_id, title, status in rows:
        console.print(f"{study_id:<12} {status:<10} {escape(title)}")


async def store_list(ctx: Any) -> list[tuple[str, str, str]]:
    from novelbus.store import studies as db

    return await db.list_studies(ctx.pool)


@study_app.command("status")
def status(study_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
           namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """Each arm's progress and cost; the pairs ready for review and those excluded (STUDY-1, STUDY-2)."""
    info = call(home, nats_url, database_url, namespace, lambda ctx: studies.status(ctx, study_id))
    if as_json:
        print_json(info)
        return
    console.print(f"{study_id} [bold]{escape(info['title'])}[/] — {info['status']}, variable {info['variable']}, "
                  f"{info['compare'][0]} against {info['compare'][1]}")
    console.print(f"registration: {info['registrationHash'] or 'not frozen'}")
    for arm, a in info["arms"].items():
        cost = a.get("cost") or {}
        console.print(f"  {arm:<16} {a['status']:<11} {a['commits']:>4} commits  input {cost.get('estInputTokens', 0):,}"
                      f" est. tokens (provider {cost.get('inputTokens') or 'n/a'})")
    console.print(f"pairs ready for review: {info['pairs']}; reviewers {info['reviewers']}, judges {info['judges']}, "
                  f"votes {info['votes']}")
    for x in info["excluded"]:
        console.print(f"  [yellow]excluded[/] {x['chapterId']}/{x['sceneId']}: differs in {', '.join(x['fields'])}")


@study_app.command("invite")
def invite(study_id: str, reviewer: Annotated[str, typer.Option("--reviewer", help="Who (shown to the operator only)")],
           home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
           panel_url: Annotated[str, typer.Option("--panel-url", help="The panel the link points at")]
           = studies.DEFAULT_PANEL_URL,
           as_json: JsonOpt = False) -> None:
    """Invite a reviewer: a token (shown once, stored hashed) and the panel link (STUDY-3)."""
    out = call(home, nats_url, database_url, namespace,
               lambda ctx: studies.invite(ctx, study_id, reviewer, panel_url=panel_url))
    if as_json:
        print_json(out)
        return
    console.print(f"{out['alias']}: token {out['token']}")
    console.print(f"link (one-time): {out['url']}")


@study_app.command("judge")
def judge(study_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
          namespace: NsOpt = "",
          judge_model: Annotated[str, typer.Option("--judge-model", help="offline | local[:PATH.gguf] | "
                                                                         "openai:<model>")] = "offline",
          as_json: JsonOpt = False) -> None:
    """Run a model judge on every pair in both orders, as one more blind reviewer (STUDY-4); it
    counts only when it agrees with the people (STUDY-6)."""
    from novelbus.bench import ab_quality

    try:
        spec = ab_quality.check_judge_spec(judge_model)
    except ValueError as e:
        fail(str(e), code=2)

    async def go(ctx: Any) -> dict[str, Any]:
        if spec == "offline":
            return await studies.judge(ctx, study_id, ab_quality.OfflineJudge(), name="offline")
        from novelbus.infra.llama import open_local_server
        from novelbus.writers.factory import make_provider

        provider = make_provider(spec, local_server=open_local_server)
        novel_id = await studies.judge_usage_novel(ctx, study_id)

        async def record(sample: dict[str, Any]) -> None:  # each call, as `bench ab` records its judge's
            if novel_id is not None:
                await store.record_usage(ctx.pool, novel_id, ab_quality.JUDGE_MODE,
                                         {k: v for k, v in sample.items() if v is not None})

        try:
            out = await studies.judge(ctx, study_id, ab_quality.ModelJudge(provider, record), name=spec)
            if novel_id is not None:
                out["usage"] = (await store.usage_totals(ctx.pool, novel_id)).get(ab_quality.JUDGE_MODE, {})
                out["usageNovelId"] = novel_id
            return out
        finally:
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()

    out = call(home, nats_url, database_url, namespace, go)
    if as_json:
        print_json(out)
    else:
        console.print(f"{out['judge']}: {out['votes']} votes, {out['failedPairs']} failed judgments")
        if "usage" in out:
            use = out["usage"]
            console.print(f"its usage, under the mode judge of novel {out['usageNovelId']} (all its runs so far): "
                          f"{use.get('calls', 0)} calls, {use.get('inputTokens', 'unknown')} input tokens, "
                          f"{use.get('outputTokens', 'unknown')} output tokens")


def _print_report(r: dict[str, Any]) -> None:
    console.print(f"[bold]{escape(r.get('title', ''))}[/] — {r['compare'][0]} against {r['compare'][1]}: verdict "
                  f"[bold]{r['verdict']}[/]")
    console.print(f"{'criterion':<20} {'wins':>5} {'ties':>5} {'losses':>6} {'both bad':>8} {'share':>6}  95 % interval")
    for name, row in r["criteria"].items():
        interval = "n/a" if row["low"] is None else f"[{row['low']:.3f}, {row['high']:.3f}]"
        share = "n/a" if row["share"] is None else f"{row['share']:.3f}"
        console.print(f"{name:<20} {row['wins']:>5} {row['ties']:>5} {row['losses']:>6} {row['bothBad']:>8} "
                      f"{share:>6}  {interval}")
    a = r["agreement"]
    console.print(f"agreement: κ {a['kappa']}, α {a['alpha']} over {a['items']} items ({a['method']})")
    for alias, bias in r["positionBias"].items():
        console.print(f"  {alias}: share of A {bias}")
    for alias, j in r["judges"].items():
        console.print(f"  {alias}: κ with the people {j['kappa']}, position consistency {j['positionConsistency']} "
                      f"→ {'counted' if j['counted'] else 'reported, ignored'}")
    cost = r.get("cost") or {}
    if cost:
        console.print(f"cost: raw input ratio {cost.get('ratio')} ({cost.get('source')}) ≤ {cost.get('limit')}")
    console.print(f"pairs: {r['pairs']['ready']} ready, {r['pairs']['enoughReviewers']} with enough reviewers "
                  f"(the rule needs {r['pairs']['needed']})")
    for reason in r["reasons"]:
        console.print(f"  - {escape(reason)}")


@study_app.command("report")
def report(study_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
           namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """The figures so far: per criterion wins, ties, losses, both-bad and a 95 % interval
    clustered by scene; agreement; each reviewer's position bias; model judges; flags traced to
    the pack (STUDY-4, STUDY-5)."""
    r = call(home, nats_url, database_url, namespace, lambda ctx: studies.report(ctx, study_id))
    if as_json:
        print_json(r)
    else:
        _print_report(r)


@study_app.command("decide")
def decide(study_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
           namespace: NsOpt = "", as_json: JsonOpt = False,
           out: Annotated[Path | None, typer.Option("--out", help="Also write the decision record here")] = None) -> None:
    """Apply the registered rule, close the study and store the decision record (STUDY-6)."""
    record = call(home, nats_url, database_url, namespace, lambda ctx: studies.decide(ctx, study_id))
    if out is not None:
        write_output(out, json.dumps(record, ensure_ascii=False, indent=2, sort_keys=True) + "\n")
    if as_json:
        print_json(record)
    else:
        _print_report({**record["figures"], "title": record.get("title", "")})


@study_app.command("adopt")
def adopt(study_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
          namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """Make a writer-mode study's decision this deployment's default writerMode (STUDY-6)."""
    out = call(home, nats_url, database_url, namespace, lambda ctx: studies.adopt(ctx, study_id))
    if as_json:
        print_json(out)
    else:
        console.print(f"default writerMode: {out['writerMode']} (study {study_id}, verdict {out['verdict']})")


async def follow_default_mode(ctx: Any, nf: Any) -> Any:
    """`novel create` of a file silent on writerMode: the deployment's default (the adopted
    decision, else the shipped one), named on stderr (STUDY-6)."""
    if "writerMode" in nf.config.model_fields_set:
        return nf
    default = await studies.default_writer_mode(ctx)
    err_console.print(f"[yellow]note:[/] {escape(default['note'])}")
    if default["writerMode"] == nf.config.writerMode:
        return nf
    return nf.model_copy(update={"config": nf.config.model_copy(update={"writerMode": default["writerMode"]})})
