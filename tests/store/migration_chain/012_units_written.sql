-- Issue 14: every unit row carries the id of the transaction that last wrote it, so a read can ask
-- only for the units written since an earlier snapshot it holds (`store.commit_index`): a unit
-- changes state, so units cannot be kept like commits, which never change. xid8: PostgreSQL 13+.
ALTER TABLE units ADD COLUMN written_xid xid8 NOT NULL DEFAULT pg_current_xact_id();

CREATE FUNCTION nb_unit_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.written_xid := pg_current_xact_id();
    RETURN NEW;
END $$;

CREATE TRIGGER units_written BEFORE UPDATE ON units FOR EACH ROW EXECUTE FUNCTION nb_unit_written();
