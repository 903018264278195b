-- novelbus schema, version 009: a unit's commit and its `unit.committed` ledger row in one
-- statement (PERF-2, issue 14).
--
-- nb_commit_body_event calls nb_commit_body (migration 007, unchanged, same outcomes) and, only
-- when it wrote the commit ('committed'), appends the event row in the same transaction: a kill
-- leaves both or neither. The row carries the event's once-key p_once_key (REL-7:
-- actors.context.once_key_of_commit), so it exists once per unit whoever writes it; a replay
-- ('existing') writes no row. The payload's commitId, effectiveCharacters, totalCharacters and
-- bodySha256 are set here (the commit id is chosen by nb_commit_body). The caller publishes the row under o_event_seq.
CREATE FUNCTION nb_commit_body_event(
    p_novel text, p_unit text, p_token_hash text, p_body jsonb, p_body_hash text, p_chars integer,
    p_context_hash text, p_run_id text, p_canon jsonb, p_refs jsonb,
    p_event_type text, p_event_payload jsonb, p_once_key text
) RETURNS TABLE (
    o_outcome text, o_detail text, o_seq integer, o_claim_id text, o_committed bigint, o_length jsonb,
    o_known jsonb, e_commit_id text, e_token_hash text, e_body_hash text, e_chars integer,
    e_context_hash text, e_completed boolean, e_total bigint, o_event_seq bigint
) LANGUAGE plpgsql AS $$
BEGIN
    SELECT b.o_outcome, b.o_detail, b.o_seq, b.o_claim_id, b.o_committed, b.o_length, b.o_known,
           b.e_commit_id, b.e_token_hash, b.e_body_hash, b.e_chars, b.e_context_hash, b.e_completed, b.e_total
    INTO o_outcome, o_detail, o_seq, o_claim_id, o_committed, o_length, o_known, e_commit_id, e_token_hash,
         e_body_hash, e_chars, e_context_hash, e_completed, e_total
    FROM nb_commit_body(p_novel, p_unit, p_token_hash, p_body, p_body_hash, p_chars, p_context_hash,
                        p_run_id, p_canon, p_refs) b;
    IF o_outcome = 'committed' AND p_event_type IS NOT NULL THEN
        INSERT INTO events (novel_id, type, payload, once_key)
        VALUES (p_novel, p_event_type,
                p_event_payload || jsonb_build_object('commitId', 'commit-' || o_seq,
                    'effectiveCharacters', p_chars, 'totalCharacters', o_committed + p_chars,
                    'bodySha256', p_body_hash),
                p_once_key)
        ON CONFLICT (once_key) WHERE once_key IS NOT NULL DO NOTHING
        RETURNING seq INTO o_event_seq;
    END IF;
    RETURN NEXT;
END $$;
