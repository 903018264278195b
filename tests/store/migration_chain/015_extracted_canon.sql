-- ROLE-3: the extractor's canon, kept apart from the writer's declarations (canon_facts), which
-- the commit statement writes once and the commit index caches as never changing.
-- extracted_commits is the ledger: one row per commit the extractor has processed (its outcome
-- and counts), written in the same transaction as that commit's facts, so a commit is extracted
-- exactly once whoever dies when (a replay finds the row and writes nothing).
CREATE TABLE IF NOT EXISTS extracted_commits (
    novel_id     text NOT NULL,
    commit_id    text NOT NULL,
    seq          integer NOT NULL CHECK (seq > 0),
    mode         text NOT NULL CHECK (mode IN ('offline', 'model')),
    outcome      text NOT NULL CHECK (outcome IN ('extracted', 'bad-reply', 'provider-error', 'no-context')),
    proposed     integer NOT NULL CHECK (proposed >= 0),
    accepted     integer NOT NULL CHECK (accepted >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, commit_id),
    FOREIGN KEY (novel_id, commit_id) REFERENCES commits (novel_id, commit_id)
);

CREATE TABLE IF NOT EXISTS extracted_canon (
    novel_id            text NOT NULL,
    commit_id           text NOT NULL,
    seq                 integer NOT NULL CHECK (seq > 0),
    idx                 integer NOT NULL CHECK (idx >= 0),
    kind                text NOT NULL
                        CHECK (kind IN ('event', 'character-state', 'relation', 'foreshadowing', 'variable')),
    summary             text NOT NULL,
    detail              text,
    sources             jsonb NOT NULL,
    character_ids       jsonb NOT NULL DEFAULT '[]',
    foreshadowing_id    text,
    foreshadowing_status text,
    PRIMARY KEY (novel_id, commit_id, idx),
    FOREIGN KEY (novel_id, commit_id) REFERENCES extracted_commits (novel_id, commit_id)
);

CREATE INDEX IF NOT EXISTS extracted_canon_seq ON extracted_canon (novel_id, seq);
