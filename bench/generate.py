"""Deterministic synthetic novel files for benchmarks and tests (any size, English or Chinese).

The same arguments always give the same dict; randomness comes only from ``random.Random(seed)``.
"""

from __future__ import annotations

import random
from typing import Any

from novelbus.novel.pack import MAX_CHARACTERS

_EN_GIVEN = ["Ada", "Bram", "Cleo", "Dorian", "Esme", "Felix", "Greta", "Hugo", "Iris", "Jonah"]
_EN_FAMILY = ["Ashdown", "Blackwood", "Carrow", "Dunmore", "Ellery", "Fairweather", "Grange"]
_EN_PLACES = [
    "the clock tower",
    "the salt market",
    "the old observatory",
    "the river locks",
    "the glasshouse",
    "the archive vaults",
    "the night ferry",
    "the quarry village",
    "the signal station",
    "the winter garden",
    "the copper mine",
    "the border inn",
]
_EN_OBJECTS = [
    "a brass key",
    "a water-stained map",
    "a cipher wheel",
    "a silver compass",
    "a sealed letter",
    "a cracked lens",
    "a ledger of debts",
    "a music box",
]
_EN_TRAITS = ["patient", "reckless", "curious", "guarded", "cheerful", "proud", "loyal", "shrewd"]
_EN_TIMES = ["at dawn", "at noon", "at dusk", "after midnight", "in the rain", "before the fair"]

_ZH_SURNAME = ["林", "沈", "顾", "苏", "陆", "白", "温", "秦", "唐", "许"]
_ZH_GIVEN = ["晚舟", "听雨", "若川", "知微", "清和", "远山", "星河", "疏影", "青禾", "明远"]
_ZH_PLACES = [
    "钟楼",
    "盐市",
    "旧天文台",
    "河闸",
    "玻璃温室",
    "档案地库",
    "夜渡口",
    "采石村",
    "信号站",
    "冬园",
    "铜矿",
    "边境客栈",
]
_ZH_OBJECTS = [
    "铜钥匙",
    "水渍地图",
    "密码轮",
    "银罗盘",
    "封缄的信",
    "裂开的镜片",
    "欠账簿",
    "八音盒",
]
_ZH_TRAITS = ["沉稳", "莽撞", "好奇", "戒备", "开朗", "骄傲", "忠诚", "精明"]
_ZH_TIMES = ["黎明时分", "正午", "黄昏", "午夜之后", "雨中", "庙会之前"]


def generate_novel_file(
    chapters: int,
    scenes_per_chapter: int,
    *,
    cjk: bool = False,
    seed: int = 0,
    unit_chars: int = 1_500,
) -> dict[str, Any]:
    """A valid NovelFile dict: ``chapters × scenes_per_chapter`` scenes, 4–8 characters, lore
    entries matching the scenes' places, foreshadowing (the first item required), and a length
    target of ``units × unit_chars`` at tolerance 0.3. ``cjk`` writes the outline in Chinese.

    Scene participants come from the first six characters only, so every participant is covered
    by the pack's characters block (PACK-3/4); the others are background cast.
    """
    if chapters < 1 or scenes_per_chapter < 1:
        raise ValueError("chapters and scenes_per_chapter must be >= 1")
    if unit_chars < 1:
        raise ValueError("unit_chars must be >= 1")
    rng = random.Random(seed)
    zh = cjk
    places = _ZH_PLACES if zh else _EN_PLACES
    objects = _ZH_OBJECTS if zh else _EN_OBJECTS
    traits = _ZH_TRAITS if zh else _EN_TRAITS
    times = _ZH_TIMES if zh else _EN_TIMES

    # Scenes take their places from the lore's places, so every scene has world-book matches.
    lore_places = places[: max(4, min(len(places), chapters + 2))]
    n_chars = rng.randint(4, 8)
    characters: list[dict[str, Any]] = []
    names: list[str] = []
    for i in range(n_chars):
        if zh:
            name = _ZH_SURNAME[i % len(_ZH_SURNAME)] + rng.choice(_ZH_GIVEN)
        else:
            name = f"{_EN_GIVEN[i % len(_EN_GIVEN)]} {rng.choice(_EN_FAMILY)}"
        names.append(name)
    for i, name in enumerate(names):
        trait = rng.choice(traits)
        obj = rng.choice(objects)
        place = rng.choice(places)
        other = (i + 1) % n_chars
        if zh:
            char = {
                "identitySummary": f"{name}，在{place}长大的{trait}之人。",
                "description": f"{name}总是随身带着{obj}，说话时习惯看向远处。",
                "personality": f"{trait}，不轻易相信别人，但一旦认定便不回头。",
                "motivation": f"查清{obj}的来历。",
                "arc": "从独自行动到学会与人合作。",
                "initialState": f"刚回到{place}。",
                "relation": f"与{names[other]}是旧识，彼此欠着人情。",
            }
        else:
            char = {
                "identitySummary": f"{name}, a {trait} native of {place}.",
                "description": f"{name} always carries {obj} and looks past people when speaking.",
                "personality": f"{trait.capitalize()}, slow to trust, impossible to turn once decided.",
                "motivation": f"Learn where {obj} came from.",
                "arc": "From working alone to trusting a partner.",
                "initialState": f"Just back in {place}.",
                "relation": f"Old acquaintance of {names[other]}; they owe each other a favour.",
            }
        characters.append(
            {
                "characterId": f"char{i + 1}",
                "name": name,
                "initialState": char["initialState"],
                "motivation": char["motivation"],
                "arc": char["arc"],
                "relations": [{"characterId": f"char{other + 1}", "description": char["relation"]}],
                "identitySummary": char["identitySummary"],
                "description": char["description"],
                "personality": char["personality"],
            }
        )

    cast = [f"char{i + 1}" for i in range(min(n_chars, MAX_CHARACTERS))]
    chapter_list: list[dict[str, Any]] = []
    scene_list: list[dict[str, Any]] = []
    for c in range(1, chapters + 1):
        cid = f"ch{c:03d}"
        obj = rng.choice(objects)
        if zh:
            chapter_list.append(
                {
                    "chapterId": cid,
                    "order": c,
                    "title": f"{obj}之谜（{c}）",
                    "purpose": f"追查{obj}的线索，推进主线。",
                    "entryCondition": "上一段的疑问尚未解开。",
                    "exitCondition": f"{obj}的一部分真相浮出水面。",
                    "keyEvents": [f"发现{obj}", "一次意外的会面"],
                }
            )
        else:
            chapter_list.append(
                {
                    "chapterId": cid,
                    "order": c,
                    "title": f"The Riddle of {obj.split(' ', 1)[1].title()} ({c})",
                    "purpose": f"Follow the trail of {obj} and move the main plot forward.",
                    "entryCondition": "The last question is still open.",
                    "exitCondition": f"Part of the truth about {obj} comes out.",
                    "keyEvents": [f"{obj.capitalize()} is found", "An unexpected meeting"],
                }
            )
        for s in range(1, scenes_per_chapter + 1):
            place = rng.choice(lore_places)
            time = rng.choice(times)
            k = rng.randint(1, min(3, len(cast)))
            participants = sorted({cast[0], *rng.sample(cast, k)}, key=cast.index)
            lead = names[cast.index(participants[-1])]
            thing = rng.choice(objects)
            if zh:
                scene: dict[str, Any] = {
                    "goal": f"{lead}在{place}寻找{thing}的下落。",
                    "timeLocation": f"{time}，{place}",
                    "causality": f"上一场留下的线索指向{place}。",
                    "conflict": f"有人抢先一步想要拿走{thing}。",
                    "expectedChange": f"{lead}对{thing}的看法改变了。",
                }
            else:
                scene = {
                    "goal": f"{lead} searches {place} for {thing}.",
                    "timeLocation": f"{time.capitalize()}, {place}",
                    "causality": f"The last clue pointed to {place}.",
                    "conflict": f"Someone else wants {thing} first.",
                    "expectedChange": f"{lead} sees {thing} differently.",
                }
            scene.update(
                {
                    "sceneId": f"{cid}s{s:02d}",
                    "chapterId": cid,
                    "order": s,
                    "participants": participants,
                }
            )
            if c == 1 and s == 1:
                scene["continuationAnchor"] = (
                    f"{time}，{place}的门半开着。"
                    if zh
                    else f"{time.capitalize()}, the door of {place} stands ajar."
                )
            scene_list.append(scene)

    lore: list[dict[str, Any]] = []
    for i, place in enumerate(lore_places):
        if zh:
            content = f"{place}是故事里的重要地点，{rng.choice(traits)}的人常在这里出没，关于{rng.choice(objects)}的传闻也从这里开始。"
        else:
            content = (
                f"{place.capitalize()} is a landmark of the story; {rng.choice(traits)} people gather "
                f"there, and the rumours about {rng.choice(objects)} began there."
            )
        lore.append({"entryId": f"lore{i + 1}", "keys": [place], "content": content})

    last = f"ch{chapters:03d}"
    foreshadowing: list[dict[str, Any]] = []
    for i in range(3 + chapters // 3):
        plant = f"ch{min(chapters, 1 + i):03d}"
        thing = rng.choice(objects)
        foreshadowing.append(
            {
                "id": f"fs{i + 1}",
                "description": (
                    f"{thing}上刻着一个无人认得的记号。"
                    if zh
                    else f"{thing.capitalize()} bears a mark nobody recognises."
                ),
                "plantAt": plant,
                "payoffAt": last,
                "required": i == 0,
                "status": "open",
            }
        )

    units = chapters * scenes_per_chapter
    if zh:
        story = {
            "premise": f"{names[0]}回到故乡，发现一件旧物牵出一连串失踪案。",
            "theme": "信任与真相的代价。",
            "mainConflict": f"{names[0]}与隐藏在暗处的操纵者之间的较量。",
            "endingDirection": "真相大白，主角选择留下守护这座城。",
            "taboos": ["不写超自然解释", "不写血腥暴力"],
            "style": "第三人称限知，简洁克制，注重声音与气味的细节。",
        }
        title = f"{places[0]}疑案（{seed}）"
    else:
        story = {
            "premise": f"{names[0]} comes home and finds that an old heirloom is tied to a string of disappearances.",
            "theme": "The price of trust and of the truth.",
            "mainConflict": f"{names[0]} against a hidden manipulator.",
            "endingDirection": "The truth comes out and the hero chooses to stay and protect the town.",
            "taboos": ["No supernatural explanations", "No graphic violence"],
            "style": "Close third person, plain and restrained, with sound and smell details.",
        }
        title = f"The Mystery of {places[0].title()} ({seed})"
    return {
        "novelId": None,
        "title": title,
        "config": {
            "writerMode": "subagent",
            "writerShape": "W2",
            "length": {
                "kind": "target",
                "targetCharacters": units * unit_chars,
                "toleranceRatio": 0.3,
            },
        },
        "outline": {
            "story": story,
            "chapters": chapter_list,
            "scenes": scene_list,
            "characters": characters,
            "lore": lore,
            "foreshadowing": foreshadowing,
        },
    }
