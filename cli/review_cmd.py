"""`novelbus review next|vote` (STUDY-3): blind review from a terminal, with a reviewer token.

What it prints is what the panel's review pages show: the opaque pair id, the scene's context
and two anonymous texts, nothing else.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from novelbus.app import studies
from novelbus.cli.common import console, fail, print_json
from novelbus.cli.study_cmd import DbOpt, HomeOpt, JsonOpt, NatsOpt, NsOpt, call

review_app = typer.Typer(no_args_is_help=True, help="Review a study's pairs blind, with a reviewer token.")
TokenOpt = Annotated[str, typer.Option("--reviewer-token", help="The token `novelbus study invite` printed")]


@review_app.command("next")
def next_pair(study_id: str, reviewer_token: TokenOpt, home: HomeOpt = None, nats_url: NatsOpt = None,
              database_url: DbOpt = None, namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """The next pair to review: the scene's context and texts A and B (or done)."""
    out = call(home, nats_url, database_url, namespace, lambda ctx: studies.next_pair(ctx, study_id, reviewer_token))
    if as_json:
        print_json(out)
        return
    progress = out["progress"]
    if out.get("done"):
        console.print(f"done: {progress['done']} of {progress['total']} pairs reviewed")
        return
    c = out["context"]
    console.print(f"[bold]pair {out['pairId']}[/] ({progress['done'] + 1} of {progress['total']})")
    console.print(f"goal: {escape(c['goal'])}\nconflict: {escape(c['conflict'])}\nwhen, where: "
                  f"{escape(c['timeLocation'])}\nparticipants: {escape(', '.join(c['participants']))}")
    if c.get("previousParagraph"):
        console.print(f"[dim]before: {escape(c['previousParagraph'])}[/]")
    console.print(f"\n[bold]A[/]\n{escape(out['a'])}\n\n[bold]B[/]\n{escape(out['b'])}\n")
    for name in out["criteria"]:
        done = " (voted)" if name in out["voted"] else ""
        console.print(f"  {name}{done}: {escape(out['questions'][name])}")
    console.print(f"vote: novelbus review vote {study_id} {out['pairId']} --reviewer-token … --criterion C "
                  "--choice a|b|tie|both-bad")


def _span(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    start, sep, end = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(start), int(end)
    except ValueError:
        fail(f"--span {escape(value[:40])!r} is not START:END (two character offsets)", code=2)


@review_app.command("vote")
def vote(study_id: str, pair_id: str, reviewer_token: TokenOpt,
         criterion: Annotated[str, typer.Option("--criterion", help="A criterion of the study")],
         choice: Annotated[str, typer.Option("--choice", help="a | b | tie | both-bad")],
         flag: Annotated[str | None, typer.Option("--flag", help="A problem's category (ConStory's five)")] = None,
         span: Annotated[str | None, typer.Option("--span", help="START:END of the problem in the flagged text")]
         = None,
         text: Annotated[str | None, typer.Option("--text", help="a | b: the text the flag is in")] = None,
         home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
         as_json: JsonOpt = False) -> None:
    """Vote on one criterion of one pair; a repeated vote changes nothing, a new one supersedes."""
    parsed = _span(span)

    async def go(ctx: Any) -> dict[str, Any]:
        return await studies.vote(ctx, study_id, pair_id, reviewer_token, criterion=criterion, choice=choice,
                                  flag=flag, span=parsed, text=text)

    out = call(home, nats_url, database_url, namespace, go)
    if as_json:
        print_json(out)
    else:
        console.print(f"{out['pairId']} {out['criterion']}: {'recorded' if out['recorded'] else 'unchanged'}")

