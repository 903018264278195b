-- REL-7 (issue 14): a driver's periodic reconciliation sweep (every 2 s) looks only at the last
-- hour's commits and finished novels (a starting driver looks at all). Without these indexes each
-- sweep read the whole history of every novel ever written, a cost that grew with the database.
CREATE INDEX commits_created ON commits (created_at);
CREATE INDEX novels_finished ON novels (finished_at) WHERE status = 'finished';
