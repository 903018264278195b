-- novelbus schema, version 008: the driver's steps before a claim in one round trip (PERF-2,
-- issue 14).
--
-- nb_prepare_lease_unit does, in one statement, what the driver did with three: prepare the unit
-- (nb_prepare_unit, unchanged, same outcomes), append its `unit.prepared` ledger row (the
-- outbox: the caller publishes it under the row's seq), record the driver's intent (DRV-1) and
-- lease the unit under it (REL-1) — the same conditional writes as store.record_intent_and_lease.
-- All of it happens in one transaction after the novel-row lock is held: a kill leaves all or
-- nothing. Each statement of a VOLATILE plpgsql function takes a new snapshot (READ COMMITTED),
-- so the lease sees the unit this call inserted.
-- p_event_type NULL: no ledger row. The payload's `unit_id` is set to the unit prepared (the id is
-- chosen here, among p_candidates).
CREATE FUNCTION nb_prepare_lease_unit(
    p_novel text, p_chapter text, p_scene text, p_fragment integer, p_anchor text, p_candidates text[],
    p_intent text, p_notice text, p_holder text, p_secs double precision,
    p_event_type text, p_event_payload jsonb
) RETURNS TABLE (o_outcome text, o_unit text, o_event_seq bigint, o_leased boolean)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT p.o_outcome, p.o_unit INTO o_outcome, o_unit
    FROM nb_prepare_unit(p_novel, p_chapter, p_scene, p_fragment, p_anchor, p_candidates) p;
    o_leased := false;
    IF o_outcome NOT IN ('existing', 'prepared') THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_event_type IS NOT NULL THEN
        INSERT INTO events (novel_id, type, payload)
        VALUES (p_novel, p_event_type, jsonb_set(p_event_payload, '{unit_id}', to_jsonb(o_unit)))
        RETURNING seq INTO o_event_seq;
    END IF;
    INSERT INTO intents (intent_id, novel_id, unit_id, notice_id)
    VALUES (p_intent, p_novel, o_unit, p_notice) ON CONFLICT (intent_id) DO NOTHING;
    UPDATE units SET lease_holder = p_holder, lease_intent_id = p_intent,
        lease_until = now() + make_interval(secs => p_secs)
    WHERE novel_id = p_novel AND unit_id = o_unit
      AND (state = 'prepared' OR (state IN ('claimed', 'committed') AND intent_id = p_intent));
    o_leased := FOUND;
    RETURN NEXT;
END $$;
