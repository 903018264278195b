-- upgrade: additive
-- SERVE-1..4: model endpoints shared by every process of a deployment (store/limiter.py).
-- Idempotent: applied on a database that may already hold these tables.

-- One row per endpoint: a Retry-After hold (SERVE-4), and since when it has been down.
CREATE TABLE IF NOT EXISTS serving_endpoints (
    endpoint    text PRIMARY KEY,
    held_until  timestamptz,
    down_since  timestamptz,
    last_ok     timestamptz
);

-- A call that waits for, or holds, a slot of its endpoint. `slot` is NULL while it waits; a
-- slot number is held by one ticket at most (the unique index), and the grant hands out only
-- numbers below the endpoint's maxInFlight, so the limit is the database's, whichever process
-- asks. A lease that is not renewed (a killed process) lapses, and its slot comes back.
CREATE TABLE IF NOT EXISTS serving_tickets (
    ticket       bigserial PRIMARY KEY,
    endpoint     text NOT NULL,
    holder       text NOT NULL,
    grp          text NOT NULL,
    asked_at     timestamptz NOT NULL,
    slot         integer CHECK (slot >= 0),
    granted_at   timestamptz,
    lease_until  timestamptz NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS serving_tickets_slot ON serving_tickets (endpoint, slot) WHERE slot IS NOT NULL;
CREATE INDEX IF NOT EXISTS serving_tickets_endpoint ON serving_tickets (endpoint, ticket);

-- SERVE-3: the group (a chapter's affinity key) each slot number served last.
CREATE TABLE IF NOT EXISTS serving_slots (
    endpoint   text NOT NULL,
    slot       integer NOT NULL,
    last_grp   text,
    last_used  timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz,
    PRIMARY KEY (endpoint, slot)
);
ALTER TABLE serving_slots ADD COLUMN IF NOT EXISTS released_at timestamptz;

-- SERVE-1: the calls started in the last minute and their tokens (requests and tokens per minute).
CREATE TABLE IF NOT EXISTS serving_calls (
    ticket      bigint PRIMARY KEY,
    endpoint    text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    tokens      integer NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS serving_calls_recent ON serving_calls (endpoint, started_at);

-- SERVE-5: a writer run's model calls as counts (no prose), so a turn's usage sample whose sender
-- died is sent again from the store instead of being marked missing.
ALTER TABLE writer_runs ADD COLUMN IF NOT EXISTS usage jsonb;
