-- ROLE-5 / PERF-2: every extraction ledger row carries the id of the transaction that wrote it (its
-- facts are written by the same statement), so a context or tool read that holds the facts of an
-- earlier snapshot asks only for the commits extracted since (`store.commit_index.EXTRACTED`),
-- as units are read (migration 012, 013): reading every extracted fact of the book per unit made
-- a unit of a book's last quarter cost twice one of its first. Rows are only ever inserted.
ALTER TABLE extracted_commits ADD COLUMN IF NOT EXISTS written_xid xid8 NOT NULL DEFAULT pg_current_xact_id();

CREATE INDEX IF NOT EXISTS extracted_commits_written ON extracted_commits (novel_id, written_xid);
