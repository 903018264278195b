-- REL-7 (issue 14): a restarted claim manager publishes again the unit.committed rows of the last
-- minute (`store.recent_once_events`); this keeps that start-up read off a full scan of the ledger.
CREATE INDEX events_once_recent ON events (type, created_at) WHERE once_key IS NOT NULL;
