-- novelbus schema, version 004: steering (PLAN-1..5) — the requirements ledger of SPEC §16.

-- User directives, in the order they were received. Receiving is idempotent on the source
-- message id. The text is user prose: it is stored here and returned to whoever asks for the
-- ledger, never put in an event or a log line.
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

-- Kept on the novel row (which every snapshot reads anyway) in the same transaction as the
-- ledger, so next_work and the claim guard see them without another query: the open counts and
-- the watermark (the last sequence of the contiguous applied/superseded prefix).
ALTER TABLE novels ADD COLUMN requirements_pending  integer NOT NULL DEFAULT 0
    CHECK (requirements_pending >= 0);
ALTER TABLE novels ADD COLUMN requirements_blocked  integer NOT NULL DEFAULT 0
    CHECK (requirements_blocked >= 0);
ALTER TABLE novels ADD COLUMN requirement_watermark integer NOT NULL DEFAULT 0
    CHECK (requirement_watermark >= 0);
