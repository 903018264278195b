"""Role projections (CTX-8, ROLE-1): what each role's model may see, per seed 002's visibility table.

The full frozen context stays inside the trusted boundary; each role gets a minimal projection,
a pure function beside the writer's pack (`novel.pack.render_writer_pack`). One module per role:
`detector.py`, `judge.py`, `planner.py`, `extractor.py`, each exposing `project(...)` that returns
exactly what that role's model gets (a JSON-ready dict) — never run, claim or delegation ids,
permissions, manifests, hashes, candidate versions, arm names, other candidates, raw paths or
facts after the role's asOf.
"""

from __future__ import annotations

from typing import Literal

Role = Literal["writer", "detector", "judge", "planner", "extractor"]
ROLES: tuple[Role, ...] = ("writer", "detector", "judge", "planner", "extractor")
