-- novelbus schema, version 005: every commit accounted exactly once, whoever dies when (REL-7).

-- Events that must exist exactly once (unit.committed, chapter.completed, novel.finished,
-- usage.missing, an abandoned run) carry a key; a second emit of the same key writes nothing.
ALTER TABLE events ADD COLUMN once_key text;
CREATE UNIQUE INDEX events_once_key ON events (once_key) WHERE once_key IS NOT NULL;

-- Each accounted turn says whether its usage sample was recorded (or marked missing), and which
-- unit and driver instance it belongs to: one sample or marker per turn, settled by one UPDATE.
ALTER TABLE turn_ledger ADD COLUMN unit_id text;
ALTER TABLE turn_ledger ADD COLUMN holder text;
ALTER TABLE turn_ledger ADD COLUMN usage text CHECK (usage IN ('sampled', 'missing'));
UPDATE turn_ledger SET usage = 'missing';  -- turns accounted before this version were not tracked
CREATE INDEX turn_ledger_usage_pending ON turn_ledger (recorded_at) WHERE usage IS NULL;

-- A writer run left `running` by a dead writer or driver is closed as `abandoned`.
CREATE INDEX writer_runs_running ON writer_runs (novel_id, claim_id) WHERE status = 'running';
