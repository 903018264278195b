-- A canon change of kind 'foreshadowing' may plant or resolve a named outline item.
ALTER TABLE canon_facts ADD COLUMN IF NOT EXISTS foreshadowing_id text;
ALTER TABLE canon_facts ADD COLUMN IF NOT EXISTS foreshadowing_status text
    CHECK (foreshadowing_status IN ('planted', 'resolved'));
