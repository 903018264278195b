"""Shared builders for store tests: a small novel file, commit bodies, database dumps."""

from __future__ import annotations

from typing import Any

import asyncpg

from novelbus.novel.body import CanonChange, CommitBody, SceneCompletion
from novelbus.novel.outline import NovelFile

NOVEL_ID = "n-test"


def novel_file(novel_id: str | None = NOVEL_ID, **config: Any) -> NovelFile:
    """Two chapters: ch-a (scenes s1, s2), ch-b (scene s3)."""
    return NovelFile.model_validate(
        {
            "novelId": novel_id,
            "title": "The Lighthouse Keeper",
            "config": config,
            "outline": {
                "story": {"premise": "A keeper finds a letter.", "theme": "memory"},
                "characters": [
                    {"characterId": "mira", "name": "Mira"},
                    {"characterId": "tomas", "name": "Tomas"},
                ],
                "chapters": [
                    {"chapterId": "ch-a", "order": 1, "title": "Arrival"},
                    {"chapterId": "ch-b", "order": 2, "title": "Storm"},
                ],
                "scenes": [
                    {
                        "sceneId": "s1",
                        "chapterId": "ch-a",
                        "order": 1,
                        "goal": "Mira arrives",
                        "participants": ["mira"],
                    },
                    {
                        "sceneId": "s2",
                        "chapterId": "ch-a",
                        "order": 2,
                        "goal": "The letter",
                        "participants": ["mira", "tomas"],
                    },
                    {
                        "sceneId": "s3",
                        "chapterId": "ch-b",
                        "order": 1,
                        "goal": "The storm",
                        "participants": ["tomas"],
                    },
                ],
            },
        }
    )


def make_body(
    *paragraphs: str,
    completed: bool = True,
    canon: list[CanonChange] | None = None,
    next_anchor: str | None = None,
) -> CommitBody:
    return CommitBody(
        paragraphs=list(paragraphs) or ["Mira climbed the stairs of the lighthouse."],
        scene_completion=SceneCompletion(
            completed=completed, basis="the goal is reached", next_anchor=next_anchor
        ),
        canon_changes=canon or [],
    )


async def dump_database(pool: asyncpg.Pool) -> str:
    """Every row of every table as JSON text, to search for secrets that must not be stored."""
    tables = await pool.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )
    parts = []
    for t in tables:
        rows = await pool.fetch(f'SELECT row_to_json(x)::text AS j FROM "{t["tablename"]}" x')
        parts.extend(r["j"] for r in rows)
    return "\n".join(parts)


async def table_counts(pool: asyncpg.Pool, *tables: str) -> dict[str, int]:
    return {t: int(await pool.fetchval(f"SELECT count(*) FROM {t}")) for t in tables}
