"""Markdown export of a novel's committed prose (OPS-1 `novelbus export`)."""

from __future__ import annotations

from novelbus.novel.next_work import commits_by_scene, scenes_by_chapter
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.novel.text import one_line


def export_markdown(snapshot: NovelSnapshot) -> str:
    """``# Title``, then ``## Chapter title`` per chapter in outline order, each followed by the
    committed paragraphs of its scenes in outline order (every live commit of a scene, in seq
    order; commits of superseded units excluded), all separated by blank lines.

    Chapters without committed prose are left out; a chapter without a title is headed
    ``Chapter <order>``.
    """
    parts = [f"# {one_line(snapshot.title)}"]
    outline = snapshot.outline
    if outline is not None:
        commits = commits_by_scene(snapshot)
        scenes = scenes_by_chapter(outline)
        for chapter in outline.ordered_chapters():
            paragraphs = [
                paragraph
                for scene in scenes.get(chapter.chapterId, [])
                for commit in commits.get((chapter.chapterId, scene.sceneId), [])
                for paragraph in commit.paragraphs
            ]
            if not paragraphs:
                continue
            title = one_line(chapter.title) or f"Chapter {chapter.order}"
            parts.append(f"## {title}")
            parts.extend(paragraphs)
    return "\n\n".join(parts) + "\n"
