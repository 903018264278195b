-- novelbus schema baseline: every table, column, index, constraint and trigger at version 18
-- (HOUSE-8, SPEC §4 STORE, §16 BASE). Step-function bodies are not here: they live only in
-- store/functions.sql, which `store.migrate` applies after the migrations. A database that
-- already holds every migration this baseline replaces is recorded as at the baseline without
-- running it (store/schema.py); tests/store/test_schema_baseline.py holds the two equal.
-- replaces: 001_init.sql 002_foreshadowing.sql 003_leases_turns.sql 004_requirements.sql
-- replaces: 005_accounting.sql 006_step_functions.sql 007_commit_function.sql 008_driver_steps.sql
-- replaces: 009_commit_event.sql 010_recent_once_events.sql 011_sweep_windows.sql
-- replaces: 012_units_written.sql 013_flat_reads.sql 014_outline_scenes.sql
-- replaces: 015_extracted_canon.sql 016_detections.sql 017_extraction_context.sql
-- replaces: 018_extracted_written.sql
-- upgrade: breaking
--
-- Unit state transitions are enforced here (CHECKs, unique indexes) and by the conditional
-- UPDATEs of the store and its step functions (ARCH-4), never by trust in callers.

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
    -- DRV-4 externalRetry: consecutive turns lost to an unavailable provider (not the unit's fault).
    external_failures     integer NOT NULL DEFAULT 0 CHECK (external_failures >= 0),
    -- PLAN-1..5: kept on the novel row (which every snapshot reads anyway) in the same
    -- transaction as the requirements ledger, so next_work and the claim guard see them without
    -- another query: the open counts and the watermark (the last sequence of the contiguous
    -- applied/superseded prefix).
    requirements_pending  integer NOT NULL DEFAULT 0 CHECK (requirements_pending >= 0),
    requirements_blocked  integer NOT NULL DEFAULT 0 CHECK (requirements_blocked >= 0),
    requirement_watermark integer NOT NULL DEFAULT 0 CHECK (requirement_watermark >= 0),
    CHECK ((status = 'paused') = (pause_reason IS NOT NULL)),
    CHECK ((status = 'finished') = (finished_at IS NOT NULL))
);

-- REL-7: the periodic reconciliation sweep looks only at the last hour's finished novels.
CREATE INDEX novels_finished ON novels (finished_at) WHERE status = 'finished';

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

-- PERF-2: the scenes of each outline revision, listed once when the revision is written (a
-- trigger), so the prepare finds its unit's scene by key instead of searching the revision's
-- document, which grows with the book.
CREATE TABLE outline_scenes (
    novel_id   text NOT NULL,
    revision   text NOT NULL,
    chapter_id text NOT NULL,
    scene_id   text NOT NULL,
    PRIMARY KEY (novel_id, revision, chapter_id, scene_id),
    FOREIGN KEY (novel_id, revision) REFERENCES outline_revisions (novel_id, revision)
);

-- The (chapter, scene) of each scene of an outline document.
CREATE FUNCTION nb_outline_scene_keys(p_outline jsonb) RETURNS TABLE (chapter_id text, scene_id text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT s ->> 'chapterId', s ->> 'sceneId'
    FROM jsonb_array_elements(COALESCE(p_outline -> 'scenes', '[]'::jsonb)) s
    WHERE s ->> 'chapterId' IS NOT NULL AND s ->> 'sceneId' IS NOT NULL
$$;

CREATE FUNCTION nb_outline_scenes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN  -- the application never changes a revision; keep the list true anyway
        DELETE FROM outline_scenes WHERE novel_id = OLD.novel_id AND revision = OLD.revision;
    END IF;
    INSERT INTO outline_scenes (novel_id, revision, chapter_id, scene_id)
    SELECT NEW.novel_id, NEW.revision, k.chapter_id, k.scene_id FROM nb_outline_scene_keys(NEW.outline) k
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER outline_revisions_scenes AFTER INSERT OR UPDATE OF outline ON outline_revisions
    FOR EACH ROW EXECUTE FUNCTION nb_outline_scenes();

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
    -- REL-1: a driver flow leases the unit it drives: taken before the claim (keyed by the intent
    -- the claim carries), renewed while the flow runs. A claimed unit whose lease lapsed has
    -- nobody driving it; any driver may then return it to prepared (STORE-4).
    lease_holder        text,
    lease_intent_id     text,
    lease_until         timestamptz,
    -- PERF-2: the id of the transaction that last wrote the row (a trigger keeps it), so a read
    -- that holds the units of an earlier snapshot asks only for those written since
    -- (`store.commit_index`). xid8: PostgreSQL 13+.
    written_xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
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
CREATE INDEX units_claimed_lease ON units (lease_until) WHERE state = 'claimed';
CREATE INDEX units_written ON units (novel_id, written_xid);

CREATE FUNCTION nb_unit_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.written_xid := pg_current_xact_id();
    RETURN NEW;
END $$;

CREATE TRIGGER units_written BEFORE UPDATE ON units FOR EACH ROW EXECUTE FUNCTION nb_unit_written();

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
    -- PERF-2: the book's effective characters through this commit, and the body's paragraph
    -- count, set by the commits_totals trigger: commits are written once, in seq order under the
    -- novel-row lock, and never deleted, so the previous commit's total plus this one's is the
    -- running sum, and no read sums the book or reads every body to count its paragraphs.
    total_chars     bigint NOT NULL,
    paragraph_count integer NOT NULL,
    PRIMARY KEY (novel_id, commit_id),
    CHECK (commit_id = 'commit-' || seq),
    UNIQUE (novel_id, seq),
    -- STORE-2: at most one live commit per unit (no duplicate prose), as a constraint.
    CONSTRAINT commits_one_per_unit UNIQUE (novel_id, unit_id),
    FOREIGN KEY (novel_id, unit_id) REFERENCES units (novel_id, unit_id)
);

CREATE INDEX commits_scene ON commits (novel_id, chapter_id, scene_id, seq);
-- REL-7: the periodic reconciliation sweep looks only at the last hour's commits.
CREATE INDEX commits_created ON commits (created_at);

CREATE FUNCTION nb_commit_totals() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.paragraph_count := COALESCE(jsonb_array_length(NEW.body -> 'paragraphs'), 0);
    IF TG_OP = 'INSERT' THEN
        NEW.total_chars := NEW.effective_chars + COALESCE((SELECT p.total_chars FROM commits p
            WHERE p.novel_id = NEW.novel_id AND p.seq < NEW.seq ORDER BY p.seq DESC LIMIT 1), 0);
    ELSIF NEW.effective_chars IS DISTINCT FROM OLD.effective_chars OR NEW.seq IS DISTINCT FROM OLD.seq THEN
        RAISE EXCEPTION 'a commit''s characters and seq are written once (commit %)', OLD.commit_id;
    ELSE
        NEW.total_chars := OLD.total_chars;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER commits_totals BEFORE INSERT OR UPDATE ON commits
    FOR EACH ROW EXECUTE FUNCTION nb_commit_totals();

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
    -- A canon change of kind 'foreshadowing' may plant or resolve a named outline item.
    foreshadowing_id     text,
    foreshadowing_status text CHECK (foreshadowing_status IN ('planted', 'resolved')),
    PRIMARY KEY (novel_id, commit_id, idx),
    FOREIGN KEY (novel_id, commit_id) REFERENCES commits (novel_id, commit_id)
);

CREATE TABLE events (
    seq        bigserial PRIMARY KEY,
    novel_id   text,
    type       text NOT NULL,
    payload    jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    -- REL-7: events that must exist exactly once (unit.committed, chapter.completed,
    -- novel.finished, usage.missing, an abandoned run) carry a key; a second emit writes nothing.
    once_key   text
);

CREATE INDEX events_novel ON events (novel_id, seq);
CREATE UNIQUE INDEX events_once_key ON events (once_key) WHERE once_key IS NOT NULL;
-- REL-7: a restarted claim manager publishes again the unit.committed rows of the last minute
-- (`store.recent_once_events`); this keeps that start-up read off a full scan of the ledger.
CREATE INDEX events_once_recent ON events (type, created_at) WHERE once_key IS NOT NULL;

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
-- REL-7: a writer run left `running` by a dead writer or driver is closed as `abandoned`.
CREATE INDEX writer_runs_running ON writer_runs (novel_id, claim_id) WHERE status = 'running';

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

-- ROLE-2: the detector finds the candidate's frozen context by its hash (the commit carries only that).
CREATE INDEX context_freeze_context ON context_freeze (context_hash);

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

-- REL-2: one accounted turn per claim, whatever redelivers or retries the accounting. Each turn
-- says whether its usage sample was recorded (or marked missing), and which unit and driver
-- instance it belongs to: one sample or marker per turn, settled by one UPDATE (REL-7).
CREATE TABLE turn_ledger (
    novel_id    text NOT NULL REFERENCES novels (novel_id),
    turn_key    text NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('committed', 'failed', 'external')),
    turn        integer NOT NULL CHECK (turn > 0),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    unit_id     text,
    holder      text,
    usage       text CHECK (usage IN ('sampled', 'missing')),
    PRIMARY KEY (novel_id, turn_key)
);

CREATE INDEX turn_ledger_usage_pending ON turn_ledger (recorded_at) WHERE usage IS NULL;

-- PLAN-1..5: user directives, in the order they were received. Receiving is idempotent on the
-- source message id. The text is user prose: it is stored here and returned to whoever asks for
-- the ledger, never put in an event or a log line.
CREATE TABLE requirements (
    novel_id          text NOT NULL REFERENCES novels (novel_id),
    requirement_id    text NOT NULL,
    sequence          integer NOT NULL CHECK (sequence > 0),
    message_id        text NOT NULL,
    text              text NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'applied', 'blocked', 'superseded')),
    applied_revision  text,
    blocked_reason    text,
    superseded_by     text,
    resolved_conflict jsonb,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, requirement_id),
    UNIQUE (novel_id, sequence),
    UNIQUE (novel_id, message_id),
    CHECK ((status = 'applied') = (applied_revision IS NOT NULL)),
    CHECK ((status = 'blocked') = (blocked_reason IS NOT NULL)),
    CHECK ((status = 'superseded') = (superseded_by IS NOT NULL))
);

-- ROLE-3: the extractor's canon, kept apart from the writer's declarations (canon_facts), which
-- the commit statement writes once and the commit index caches as never changing.
-- extracted_commits is the ledger: one row per commit the extractor has processed (its outcome
-- and counts), written in the same transaction as that commit's facts, so a commit is extracted
-- exactly once whoever dies when (a replay finds the row and writes nothing).
CREATE TABLE extracted_commits (
    novel_id     text NOT NULL,
    commit_id    text NOT NULL,
    seq          integer NOT NULL CHECK (seq > 0),
    mode         text NOT NULL CHECK (mode IN ('offline', 'model')),
    outcome      text NOT NULL CHECK (outcome IN ('extracted', 'bad-reply', 'provider-error', 'no-context')),
    proposed     integer NOT NULL CHECK (proposed >= 0),
    accepted     integer NOT NULL CHECK (accepted >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- ROLE-3, CTX-9: the frozen context the extraction was read with (NULL: 'no-context').
    context_hash text,
    -- ROLE-5 / PERF-2: the transaction that wrote the row (its facts are written by the same
    -- statement), so a read holding an earlier snapshot's facts asks only for the commits
    -- extracted since (`store.commit_index.EXTRACTED`). Rows are only ever inserted.
    written_xid  xid8 NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (novel_id, commit_id),
    FOREIGN KEY (novel_id, commit_id) REFERENCES commits (novel_id, commit_id)
);

CREATE INDEX extracted_commits_written ON extracted_commits (novel_id, written_xid);

CREATE TABLE extracted_canon (
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

CREATE INDEX extracted_canon_seq ON extracted_canon (novel_id, seq);

-- ROLE-2: the semantic detector's records. One row per candidate checked: bound to the context
-- the candidate was written in (context_hash), the candidate itself (body_hash) and the context
-- the detector judged it in (detection_context_hash). Append-only and idempotent on
-- (novel, unit, context, body): a redelivered check finds the row and reads its verdict back.
CREATE TABLE detections (
    novel_id               text NOT NULL REFERENCES novels (novel_id),
    unit_id                text NOT NULL,
    context_hash           text NOT NULL,
    body_hash              text NOT NULL,
    detection_context_hash text NOT NULL,
    claim_id               text,
    detector               text NOT NULL CHECK (detector IN ('offline', 'model')),
    outcome                text NOT NULL
                           CHECK (outcome IN ('pass', 'contradicted', 'evidence-gap', 'detector-unparsed')),
    supported              integer NOT NULL CHECK (supported >= 0),
    contradicted           integer NOT NULL CHECK (contradicted >= 0),
    unknown                integer NOT NULL CHECK (unknown >= 0),
    gaps                   jsonb NOT NULL DEFAULT '[]',
    claims                 jsonb NOT NULL DEFAULT '[]',
    created_at             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, unit_id, context_hash, body_hash)
);

CREATE INDEX detections_claim ON detections (novel_id, unit_id, claim_id);

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

CREATE TRIGGER detections_append_only
    BEFORE UPDATE OR DELETE ON detections
    FOR EACH ROW EXECUTE FUNCTION novelbus_refuse_change();
