-- ROLE-2: the semantic detector's records. One row per candidate checked: bound to the context
-- the candidate was written in (context_hash), the candidate itself (body_hash) and the context
-- the detector judged it in (detection_context_hash). Append-only and idempotent on
-- (novel, unit, context, body): a redelivered check finds the row and reads its verdict back.
CREATE TABLE IF NOT EXISTS detections (
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

CREATE INDEX IF NOT EXISTS detections_claim ON detections (novel_id, unit_id, claim_id);

DROP TRIGGER IF EXISTS detections_append_only ON detections;
CREATE TRIGGER detections_append_only
    BEFORE UPDATE OR DELETE ON detections
    FOR EACH ROW EXECUTE FUNCTION novelbus_refuse_change();

-- The detector finds the candidate's frozen context by its hash (the commit carries only that).
CREATE INDEX IF NOT EXISTS context_freeze_context ON context_freeze (context_hash);
