-- upgrade: additive
-- STUDY-1..8: pre-registered studies, their arms, the pairs offered for review, the reviewers
-- (tokens stored hashed), the votes (append-only), the decisions and the deployment's adoptions.
-- Idempotent: applied on a database that may already hold these tables.

CREATE TABLE IF NOT EXISTS studies (
    study_id    text PRIMARY KEY,
    title       text NOT NULL,
    draft       jsonb NOT NULL,               -- the registration as created (frozen below)
    status      text NOT NULL DEFAULT 'registered'
                CHECK (status IN ('registered', 'running', 'closed')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    closed_at   timestamptz
);

-- STUDY-1: the registration frozen once any arm starts: append-only, one row per study.
CREATE TABLE IF NOT EXISTS study_registrations (
    study_id           text PRIMARY KEY REFERENCES studies (study_id),
    registration       jsonb NOT NULL,
    registration_hash  text NOT NULL,
    frozen_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS study_arms (
    study_id  text NOT NULL REFERENCES studies (study_id),
    arm       text NOT NULL,
    novel_id  text NOT NULL REFERENCES novels (novel_id),
    PRIMARY KEY (study_id, arm)
);

-- A sampled scene both arms wrote: its two texts as they were when the pair was made, the
-- blind context a reviewer sees, and the single-variable check (STUDY-2): `refused` lists the
-- fields that differed; a pair with any is excluded from review.
CREATE TABLE IF NOT EXISTS study_pairs (
    pair_id     text PRIMARY KEY,
    study_id    text NOT NULL REFERENCES studies (study_id),
    pair_index  integer NOT NULL,
    chapter_id  text NOT NULL,
    scene_id    text NOT NULL,
    test_text   text NOT NULL,
    base_text   text NOT NULL,
    context     jsonb NOT NULL,
    refused     jsonb NOT NULL DEFAULT '[]',
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (study_id, chapter_id, scene_id),
    UNIQUE (study_id, pair_index)
);

-- People (invited, a token stored as its sha256) and model judges, under an alias.
CREATE TABLE IF NOT EXISTS study_reviewers (
    study_id        text NOT NULL REFERENCES studies (study_id),
    alias           text NOT NULL,
    reviewer_index  integer NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('person', 'judge')),
    name            text NOT NULL,
    token_hash      text UNIQUE,
    session_hash    text UNIQUE,
    redeemed_at     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (study_id, alias),
    UNIQUE (study_id, reviewer_index)
);

-- STUDY-3: votes are append-only; the latest row of (study, reviewer, pair, criterion) is the
-- effective one; a submit equal to it writes nothing.
CREATE TABLE IF NOT EXISTS study_votes (
    vote_id        bigserial PRIMARY KEY,
    study_id       text NOT NULL REFERENCES studies (study_id),
    alias          text NOT NULL,
    pair_id        text NOT NULL REFERENCES study_pairs (pair_id),
    criterion      text NOT NULL,
    choice         text NOT NULL CHECK (choice IN ('a', 'b', 'tie', 'both-bad')),
    a_is_test      boolean NOT NULL,
    flag_category  text,
    flag_text      text CHECK (flag_text IN ('a', 'b')),
    span_start     integer,
    span_end       integer,
    created_at     timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (study_id, alias) REFERENCES study_reviewers (study_id, alias)
);
CREATE INDEX IF NOT EXISTS study_votes_latest ON study_votes (study_id, alias, pair_id, criterion, vote_id DESC);

-- STUDY-6: one decision per study, as the record `study decide` printed; append-only.
CREATE TABLE IF NOT EXISTS study_decisions (
    study_id    text PRIMARY KEY REFERENCES studies (study_id),
    record      jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- STUDY-6: `study adopt`: the deployment's default writerMode is the latest adoption's.
CREATE TABLE IF NOT EXISTS study_adoptions (
    seq          bigserial PRIMARY KEY,
    study_id     text NOT NULL REFERENCES study_decisions (study_id),
    writer_mode  text NOT NULL CHECK (writer_mode IN ('inline', 'subagent')),
    created_at   timestamptz NOT NULL DEFAULT now()
);

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'study_registrations_append_only') THEN
        CREATE TRIGGER study_registrations_append_only BEFORE UPDATE OR DELETE ON study_registrations
            FOR EACH ROW EXECUTE FUNCTION novelbus_refuse_change();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'study_votes_append_only') THEN
        CREATE TRIGGER study_votes_append_only BEFORE UPDATE OR DELETE ON study_votes
            FOR EACH ROW EXECUTE FUNCTION novelbus_refuse_change();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'study_decisions_append_only') THEN
        CREATE TRIGGER study_decisions_append_only BEFORE UPDATE OR DELETE ON study_decisions
            FOR EACH ROW EXECUTE FUNCTION novelbus_refuse_change();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'study_adoptions_append_only') THEN
        CREATE TRIGGER study_adoptions_append_only BEFORE UPDATE OR DELETE ON study_adoptions
            FOR EACH ROW EXECUTE FUNCTION novelbus_refuse_change();
    END IF;
END
$$;
