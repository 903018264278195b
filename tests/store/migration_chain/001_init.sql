-- novelbus schema, version 001 (SPEC §4 STORE, §16 BASE).
-- Unit state transitions are enforced here (CHECKs, unique indexes) and by the
-- conditional UPDATEs in store/*.py (ARCH-4), never by trust in callers.

CREATE TABLE novels (
    novel_id              text PRIMARY KEY,
    title                 text NOT NULL,
    config                jsonb NOT NULL,
    writer_mode           text NOT NULL CHECK (writer_mode IN ('inline', 'subagent')),
    status                text NOT NULL DEFAULT 'active'
                          CHECK (status IN ('active', 'paused', 'finished')),
    pause_reason          text,
    outline_revision      text,
    turns                 integer NOT NULL DEFAULT 0 CHECK (turns >= 0),
    writer_runs           integer NOT NULL DEFAULT 0 CHECK (writer_runs >= 0),
    writer_output_chars   bigint  NOT NULL DEFAULT 0 CHECK (writer_output_chars >= 0),
    consecutive_failures  integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    stall_signature       text,
    stall_count           integer NOT NULL DEFAULT 0 CHECK (stall_count >= 0),
    duration_window_start timestamptz NOT NULL DEFAULT now(),
    created_at            timestamptz NOT NULL DEFAULT now(),
    finished_at           timestamptz,
    CHECK ((status = 'paused') = (pause_reason IS NOT NULL)),
    CHECK ((status = 'finished') = (finished_at IS NOT NULL))
);

CREATE TABLE outline_revisions (
    novel_id   text NOT NULL REFERENCES novels (novel_id),
    revision   text NOT NULL,
    parent     text,
    reason     text NOT NULL,
    outline    jsonb NOT NULL,
    seq        integer NOT NULL CHECK (seq > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, revision),
    UNIQUE (novel_id, seq)
);

CREATE TABLE units (
    novel_id            text NOT NULL REFERENCES novels (novel_id),
    unit_id             text NOT NULL,
    chapter_id          text NOT NULL,
    scene_id            text NOT NULL,
    fragment            integer NOT NULL CHECK (fragment >= 1),
    state               text NOT NULL DEFAULT 'prepared'
                        CHECK (state IN ('prepared', 'claimed', 'committed', 'superseded')),
    attempt             integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    continuation_anchor text,
    last_error          text,
    token_hash          text,
    claim_id            text,
    claimed_mode        text CHECK (claimed_mode IN ('inline', 'subagent')),
    intent_id           text,
    claimed_by          text,  -- CLM-5: the claim-manager instance holding the delegation
    created_seq         bigint GENERATED ALWAYS AS IDENTITY,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, unit_id),
    UNIQUE (novel_id, chapter_id, scene_id, fragment),
    -- STORE-1: a claimed unit always carries a token hash and a claim id.
    CHECK (state <> 'claimed' OR (token_hash IS NOT NULL AND claim_id IS NOT NULL)),
    -- STORE-4: a prepared unit carries no token hash.
    CHECK (state <> 'prepared' OR token_hash IS NULL)
);

-- DRV-1: units of one novel are strictly sequential, so at most one claimed unit per novel.
CREATE UNIQUE INDEX units_one_claim_per_novel ON units (novel_id) WHERE state = 'claimed';
CREATE INDEX units_claimed ON units (state) WHERE state = 'claimed';

CREATE TABLE commits (
    novel_id        text NOT NULL REFERENCES novels (novel_id),
    seq             integer NOT NULL CHECK (seq > 0),
    commit_id       text NOT NULL,
    unit_id         text NOT NULL,
    chapter_id      text NOT NULL,
    scene_id        text NOT NULL,
    claim_id        text NOT NULL,
    token_hash      text NOT NULL,
    body            jsonb NOT NULL,
    body_hash       text NOT NULL,
    effective_chars integer NOT NULL CHECK (effective_chars >= 0),
    context_hash    text,
    run_id          text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, commit_id),
    CHECK (commit_id = 'commit-' || seq),
    UNIQUE (novel_id, seq),
    -- STORE-2: at most one live commit per unit (no duplicate prose), as a constraint.
    CONSTRAINT commits_one_per_unit UNIQUE (novel_id, unit_id),
    FOREIGN KEY (novel_id, unit_id) REFERENCES units (novel_id, unit_id)
);

CREATE INDEX commits_scene ON commits (novel_id, chapter_id, scene_id, seq);

CREATE TABLE canon_facts (
    novel_id      text NOT NULL,
    commit_id     text NOT NULL,
    idx           integer NOT NULL CHECK (idx >= 0),
    kind          text NOT NULL
                  CHECK (kind IN ('event', 'character-state', 'relation', 'foreshadowing', 'variable')),
    summary       text NOT NULL,
    detail        text,
    sources       jsonb NOT NULL,
    character_ids jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (novel_id, commit_id, idx),
    FOREIGN KEY (novel_id, commit_id) REFERENCES commits (novel_id, commit_id)
);

CREATE TABLE events (
    seq        bigserial PRIMARY KEY,
    novel_id   text,
    type       text NOT NULL,
    payload    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX events_novel ON events (novel_id, seq);

CREATE TABLE intents (
    intent_id  text PRIMARY KEY,
    novel_id   text NOT NULL REFERENCES novels (novel_id),
    unit_id    text NOT NULL,
    notice_id  text,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE writer_runs (
    run_id       text PRIMARY KEY,
    novel_id     text NOT NULL REFERENCES novels (novel_id),
    unit_id      text NOT NULL,
    claim_id     text,
    dispatch     integer NOT NULL CHECK (dispatch >= 1),
    mode         text NOT NULL,
    provider     text NOT NULL,
    status       text NOT NULL DEFAULT 'running',
    reason       text,
    output_chars integer NOT NULL DEFAULT 0 CHECK (output_chars >= 0),
    manifest     jsonb,
    started_at   timestamptz NOT NULL DEFAULT now(),
    ended_at     timestamptz
);

CREATE INDEX writer_runs_novel ON writer_runs (novel_id, started_at);

-- USE-2: a ring of the last 50 samples per novel (trimmed by store.record_usage).
CREATE TABLE usage_samples (
    novel_id    text NOT NULL REFERENCES novels (novel_id),
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    mode        text NOT NULL,
    sample      jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, seq)
);

CREATE TABLE usage_totals (
    novel_id text NOT NULL REFERENCES novels (novel_id),
    mode     text NOT NULL,
    samples  integer NOT NULL DEFAULT 0,
    totals   jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (novel_id, mode)
);

-- CTX-6: frozen contexts are append-only and idempotent on the manifest hash.
CREATE TABLE context_freeze (
    manifest_hash text PRIMARY KEY,
    novel_id      text NOT NULL REFERENCES novels (novel_id),
    unit_id       text NOT NULL,
    context_hash  text NOT NULL,
    manifest      jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE notes (
    novel_id   text NOT NULL REFERENCES novels (novel_id),
    note_id    text NOT NULL,
    text       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, note_id)
);

CREATE TABLE sessions (
    session_id text PRIMARY KEY,
    novel_id   text NOT NULL REFERENCES novels (novel_id),
    chapter_id text,
    history    jsonb NOT NULL DEFAULT '[]',
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- BUS-2 / REL-2: handlers record message ids so redelivery changes nothing twice.
CREATE TABLE processed_messages (
    message_id text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Append-only ledgers: updates and deletes are refused by the database itself.
CREATE FUNCTION novelbus_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER events_append_only
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION novelbus_refuse_change();

CREATE TRIGGER context_freeze_append_only
    BEFORE UPDATE OR DELETE ON context_freeze
    FOR EACH ROW EXECUTE FUNCTION novelbus_refuse_change();
