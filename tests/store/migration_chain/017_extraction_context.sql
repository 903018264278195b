-- ROLE-3, CTX-9: an extraction is bound to the frozen context it was read with (the SHA-256 of the
-- extractor's context; NULL when there was none to freeze, outcome 'no-context').
ALTER TABLE extracted_commits ADD COLUMN IF NOT EXISTS context_hash text;
