-- upgrade: additive
-- OPS-11: deletion receipts and events retention. Idempotent: applied on a database that may
-- already hold these tables.

-- One row per `novel delete` (and per events-retention prune): what went, counted per table.
-- The novel's id is kept only as its SHA-256, so the receipt names no row of the deleted novel
-- and an operator who knows the id can still find it. `xact` is the transaction that deleted: the
-- append-only ledgers let a row go only in the transaction that wrote its receipt
-- (novelbus_refuse_change below).
CREATE TABLE IF NOT EXISTS ledger_deletions (
    deletion_id  bigserial PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN ('novel', 'events-retention')),
    novel_sha256 text,
    xact         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    receipt      jsonb NOT NULL DEFAULT '{}',
    deleted_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'novel') = (novel_sha256 IS NOT NULL))
);

CREATE INDEX IF NOT EXISTS ledger_deletions_xact ON ledger_deletions (xact);

-- Events retention per novel, in days (none: the deployment's, `novelbus events prune --days`).
CREATE TABLE IF NOT EXISTS novel_retention (
    novel_id    text PRIMARY KEY REFERENCES novels (novel_id),
    events_days integer NOT NULL CHECK (events_days >= 1)
);

-- The append-only ledgers refuse every update and delete, but for the delete path: a row may go
-- in the transaction that recorded its receipt in ledger_deletions — a novel's rows for
-- `novel delete` (matched by the SHA-256 of their novel_id), event rows for events retention.
CREATE OR REPLACE FUNCTION novelbus_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (
        SELECT 1 FROM ledger_deletions d
        WHERE d.xact = pg_current_xact_id()
          AND ((d.kind = 'novel'
                AND d.novel_sha256 = encode(sha256(convert_to(to_jsonb(OLD) ->> 'novel_id', 'UTF8')), 'hex'))
               OR (d.kind = 'events-retention' AND TG_TABLE_NAME = 'events'))) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'table % is append-only', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;
