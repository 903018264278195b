-- novelbus schema, version 003: claim leases and once-only turn accounting (REL-1, REL-2, CLM-5).

-- A driver flow leases the unit it drives: taken before the claim (keyed by the intent the
-- claim carries), renewed while the flow runs. A claimed unit whose lease lapsed has nobody
-- driving it (its driver or claim-manager instance died and did not come back); any driver
-- may then return it to prepared (STORE-4) with a conditional update.
ALTER TABLE units ADD COLUMN lease_holder    text;
ALTER TABLE units ADD COLUMN lease_intent_id text;
ALTER TABLE units ADD COLUMN lease_until     timestamptz;

CREATE INDEX units_claimed_lease ON units (lease_until) WHERE state = 'claimed';

-- DRV-4 externalRetry: consecutive turns lost to an unavailable provider (not the unit's fault).
ALTER TABLE novels ADD COLUMN external_failures integer NOT NULL DEFAULT 0
    CHECK (external_failures >= 0);

-- REL-2: one accounted turn per claim, whatever redelivers or retries the accounting.
CREATE TABLE turn_ledger (
    novel_id    text NOT NULL REFERENCES novels (novel_id),
    turn_key    text NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('committed', 'failed', 'external')),
    turn        integer NOT NULL CHECK (turn > 0),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (novel_id, turn_key)
);
