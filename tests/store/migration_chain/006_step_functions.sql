-- novelbus schema, version 006: one round trip per unit step (PERF-2).
--
-- Each function does, inside the database and in one statement, what a store function used to do
-- with BEGIN, a novel-row lock, several reads, its writes and COMMIT. The checks and their order
-- are those of the Python functions (store/units.py, store/commits.py, store/recovery.py), which
-- call these and raise the same typed errors with the same messages: a function answers with an
-- outcome code and the facts a message needs, it never raises a domain error itself. Every
-- statement in a function runs after the novel-row lock is held, so it sees what the lock
-- serialises (READ COMMITTED takes a new snapshot per statement in a VOLATILE function).

-- STORE-1 claim: novel active, outline present, expected revision, expected watermark, no
-- requirement open, no other unit claimed, unit prepared — in this order (SPEC §16 Claim).
CREATE FUNCTION nb_claim_unit(
    p_novel text, p_unit text, p_token_hash text, p_claim_id text, p_mode text, p_intent text,
    p_claimed_by text, p_expected_revision text, p_expected_watermark integer
) RETURNS TABLE (
    o_outcome text, o_attempt integer, o_detail text, o_status text, o_revision text,
    o_watermark integer, o_pending integer, o_blocked integer, o_dispatch_limit jsonb
) LANGUAGE plpgsql AS $$
DECLARE
    n novels%ROWTYPE;
    v_attempt integer;
    v_other text;
BEGIN
    SELECT * INTO n FROM novels WHERE novel_id = p_novel FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'novel-not-found'::text, NULL::integer, NULL::text, NULL::text, NULL::text,
            NULL::integer, NULL::integer, NULL::integer, NULL::jsonb;
        RETURN;
    END IF;
    o_status := n.status; o_revision := n.outline_revision; o_watermark := n.requirement_watermark;
    o_pending := n.requirements_pending; o_blocked := n.requirements_blocked;
    o_dispatch_limit := n.config -> 'budgets' -> 'writerDispatchLimit';
    IF n.status <> 'active' THEN
        o_outcome := 'not-active';
    ELSIF n.outline_revision IS NULL OR NOT EXISTS (
            SELECT 1 FROM outline_revisions r WHERE r.novel_id = p_novel AND r.revision = n.outline_revision) THEN
        o_outcome := 'outline-missing';
    ELSIF p_expected_revision IS NOT NULL AND p_expected_revision <> n.outline_revision THEN
        o_outcome := 'revision-conflict';
    ELSIF p_expected_watermark IS NOT NULL AND p_expected_watermark <> n.requirement_watermark THEN
        o_outcome := 'watermark-conflict';
    ELSIF n.requirements_pending > 0 OR n.requirements_blocked > 0 THEN
        o_outcome := 'requirements-open';
    ELSE
        BEGIN
            -- ARCH-4: a conditional update, never a read-then-write.
            UPDATE units u SET state = 'claimed', attempt = u.attempt + 1, token_hash = p_token_hash,
                claim_id = p_claim_id, claimed_mode = p_mode, intent_id = p_intent, claimed_by = p_claimed_by,
                updated_at = now()
            WHERE u.novel_id = p_novel AND u.unit_id = p_unit AND u.state = 'prepared'
              AND NOT EXISTS (SELECT 1 FROM units o WHERE o.novel_id = p_novel
                              AND o.state = 'claimed' AND o.unit_id <> p_unit)
            RETURNING u.attempt INTO v_attempt;
        EXCEPTION WHEN unique_violation THEN  -- units_one_claim_per_novel, the SQL backstop
            o_outcome := 'in-flight';
            RETURN NEXT;
            RETURN;
        END;
        IF v_attempt IS NOT NULL THEN
            o_outcome := 'claimed'; o_attempt := v_attempt;
        ELSE
            SELECT o.unit_id INTO v_other FROM units o
            WHERE o.novel_id = p_novel AND o.state = 'claimed' AND o.unit_id <> p_unit LIMIT 1;
            IF v_other IS NOT NULL THEN
                o_outcome := 'in-flight'; o_detail := v_other;
            ELSE
                SELECT u.state INTO o_detail FROM units u WHERE u.novel_id = p_novel AND u.unit_id = p_unit;
                o_outcome := CASE WHEN o_detail IS NULL THEN 'unit-not-found' ELSE 'not-claimable' END;
            END IF;
        END IF;
    END IF;
    RETURN NEXT;
END $$;

-- prepare_unit: the unit of (chapter, scene, fragment), or a new one under the first free id of
-- `p_candidates`; 'exhausted' when all of them are taken (the caller sends the next candidates).
CREATE FUNCTION nb_prepare_unit(
    p_novel text, p_chapter text, p_scene text, p_fragment integer, p_anchor text, p_candidates text[]
) RETURNS TABLE (o_outcome text, o_unit text) LANGUAGE plpgsql AS $$
DECLARE
    n novels%ROWTYPE;
    v_outline jsonb;
    v_candidate text;
BEGIN
    SELECT * INTO n FROM novels WHERE novel_id = p_novel FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'novel-not-found'::text, NULL::text;
        RETURN;
    END IF;
    SELECT u.unit_id INTO o_unit FROM units u
    WHERE u.novel_id = p_novel AND u.chapter_id = p_chapter AND u.scene_id = p_scene AND u.fragment = p_fragment;
    IF o_unit IS NOT NULL THEN
        o_outcome := 'existing';
        RETURN NEXT;
        RETURN;
    END IF;
    IF n.status = 'finished' THEN
        o_outcome := 'finished';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT r.outline INTO v_outline FROM outline_revisions r
    WHERE r.novel_id = p_novel AND r.revision = n.outline_revision;
    IF v_outline IS NULL THEN
        o_outcome := 'outline-missing';
    ELSIF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v_outline -> 'scenes') s
                      WHERE s ->> 'sceneId' = p_scene AND s ->> 'chapterId' = p_chapter) THEN
        o_outcome := 'scene-not-found';
    ELSE
        SELECT c INTO v_candidate FROM unnest(p_candidates) WITH ORDINALITY AS x(c, i)
        WHERE NOT EXISTS (SELECT 1 FROM units u WHERE u.novel_id = p_novel AND u.unit_id = x.c)
        ORDER BY i LIMIT 1;
        IF v_candidate IS NULL THEN
            o_outcome := 'exhausted';
        ELSE
            INSERT INTO units (novel_id, unit_id, chapter_id, scene_id, fragment, continuation_anchor)
            VALUES (p_novel, v_candidate, p_chapter, p_scene, p_fragment, p_anchor);
            o_outcome := 'prepared'; o_unit := v_candidate;
        END IF;
    END IF;
    RETURN NEXT;
END $$;

-- REL-2 account_turn: one accounted turn per key; the counters as they are after it (or were,
-- for a repeat), and whether this call accounted it. No row: the novel does not exist.
CREATE FUNCTION nb_account_turn(
    p_novel text, p_turn_key text, p_outcome text, p_chars bigint, p_signature text, p_unit text, p_holder text
) RETURNS TABLE (o_first boolean, o_novel novels) LANGUAGE plpgsql AS $$
DECLARE
    n novels%ROWTYPE;
    v_turn integer;
BEGIN
    SELECT * INTO n FROM novels WHERE novel_id = p_novel FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO turn_ledger (novel_id, turn_key, outcome, turn, unit_id, holder)
    VALUES (p_novel, p_turn_key, p_outcome, n.turns + 1, p_unit, p_holder)
    ON CONFLICT (novel_id, turn_key) DO NOTHING RETURNING turn INTO v_turn;
    IF v_turn IS NULL THEN
        RETURN QUERY SELECT false, n;
        RETURN;
    END IF;
    IF p_outcome = 'committed' THEN
        UPDATE novels SET turns = turns + 1, writer_runs = writer_runs + 1,
            writer_output_chars = writer_output_chars + p_chars, consecutive_failures = 0,
            stall_signature = NULL, stall_count = 0, external_failures = 0
        WHERE novel_id = p_novel RETURNING * INTO n;
    ELSIF p_outcome = 'failed' THEN
        UPDATE novels SET turns = turns + 1, consecutive_failures = consecutive_failures + 1,
            stall_count = CASE WHEN p_signature IS NULL THEN 0
                               WHEN stall_signature = p_signature THEN stall_count + 1 ELSE 1 END,
            stall_signature = p_signature, external_failures = 0
        WHERE novel_id = p_novel RETURNING * INTO n;
    ELSE
        UPDATE novels SET turns = turns + 1, external_failures = external_failures + 1
        WHERE novel_id = p_novel RETURNING * INTO n;
    END IF;
    RETURN QUERY SELECT true, n;
END $$;

-- STORE-2 commit, the write half: the caller read the unit, the book and the novel's length
-- config in one statement and checked the body (novel.commitcheck, STORE-6) against them; this
-- writes the commit, its canon facts (STORE-3) and the unit's new state under the novel lock —
-- only if nothing it read has changed since ('changed' otherwise: the caller reads again).
CREATE FUNCTION nb_commit_write(
    p_novel text, p_unit text, p_token_hash text, p_seq integer, p_length jsonb, p_body jsonb,
    p_body_hash text, p_chars integer, p_context_hash text, p_run_id text, p_canon jsonb
) RETURNS TABLE (o_outcome text, o_claim_id text) LANGUAGE plpgsql AS $$
DECLARE
    v_length jsonb;
    u units%ROWTYPE;
    v_next integer;
    v_commit text := 'commit-' || p_seq;
BEGIN
    SELECT n.config -> 'length' INTO v_length FROM novels n WHERE n.novel_id = p_novel FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'changed'::text, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO u FROM units x WHERE x.novel_id = p_novel AND x.unit_id = p_unit FOR UPDATE;
    SELECT COALESCE(MAX(c.seq), 0) + 1 INTO v_next FROM commits c WHERE c.novel_id = p_novel;
    IF v_length IS DISTINCT FROM p_length OR v_next <> p_seq OR u.state IS DISTINCT FROM 'claimed'
            OR u.token_hash IS DISTINCT FROM p_token_hash THEN
        RETURN QUERY SELECT 'changed'::text, NULL::text;
        RETURN;
    END IF;
    INSERT INTO commits (novel_id, seq, commit_id, unit_id, chapter_id, scene_id, claim_id, token_hash, body,
                         body_hash, effective_chars, context_hash, run_id)
    VALUES (p_novel, p_seq, v_commit, p_unit, u.chapter_id, u.scene_id, u.claim_id, p_token_hash, p_body,
            p_body_hash, p_chars, p_context_hash, p_run_id);
    INSERT INTO canon_facts (novel_id, commit_id, idx, kind, summary, detail, sources, character_ids,
                             foreshadowing_id, foreshadowing_status)
    SELECT p_novel, v_commit, (f.ord - 1)::integer, f.e ->> 'kind', f.e ->> 'summary', f.e ->> 'detail',
           f.e -> 'sources', f.e -> 'character_ids', f.e ->> 'foreshadowing_id', f.e ->> 'foreshadowing_status'
    FROM jsonb_array_elements(p_canon) WITH ORDINALITY AS f(e, ord);
    UPDATE units SET state = 'committed', updated_at = now()
    WHERE novel_id = p_novel AND unit_id = p_unit AND state = 'claimed' AND token_hash = p_token_hash;
    RETURN QUERY SELECT 'committed'::text, u.claim_id;
END $$;

-- USE-1, REL-2, REL-7 a turn's usage sample, the write half: the caller read the mode's totals
-- (`p_samples` samples; NULL: none yet) and added the sample to them (store.usage.add_totals).
-- Under the novel's usage lock: 'changed' when the totals moved since (nothing written; the caller
-- reads again); 'duplicate' when the turn's usage was already settled or the message was seen;
-- else the turn is marked sampled (when it was accounted), the message processed (when keyed), the sample enters the ring (the last
-- `p_ring` kept) and the totals are replaced.
CREATE FUNCTION nb_record_turn_usage(
    p_novel text, p_turn_key text, p_message_key text, p_mode text, p_sample jsonb, p_ring integer,
    p_samples integer, p_totals jsonb
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_samples integer;
    v_usage text;
    v_found boolean := false;
BEGIN
    -- Serialise writers of one novel's ring so a concurrent pair cannot leave p_ring + 1 rows.
    PERFORM pg_advisory_xact_lock(hashtext('usage:' || p_novel));
    SELECT t.samples INTO v_samples FROM usage_totals t WHERE t.novel_id = p_novel AND t.mode = p_mode;
    IF v_samples IS DISTINCT FROM p_samples THEN
        RETURN 'changed';
    END IF;
    IF p_turn_key IS NOT NULL THEN
        SELECT l.usage, true INTO v_usage, v_found FROM turn_ledger l
        WHERE l.novel_id = p_novel AND l.turn_key = p_turn_key FOR UPDATE;
        IF v_found AND v_usage IS NOT NULL THEN
            RETURN 'duplicate';
        END IF;
        IF v_found THEN
            UPDATE turn_ledger SET usage = 'sampled' WHERE novel_id = p_novel AND turn_key = p_turn_key;
        END IF;
    END IF;
    IF p_message_key IS NOT NULL THEN
        INSERT INTO processed_messages (message_id) VALUES (p_message_key) ON CONFLICT (message_id) DO NOTHING;
        IF NOT FOUND THEN
            RETURN 'duplicate';
        END IF;
    END IF;
    -- The DELETE reads the ring as it was before this INSERT: it keeps the p_ring - 1 newest
    -- older samples and the new one.
    WITH kept AS (SELECT s.seq FROM usage_samples s WHERE s.novel_id = p_novel ORDER BY s.seq DESC LIMIT p_ring - 1),
         added AS (INSERT INTO usage_samples (novel_id, mode, sample) VALUES (p_novel, p_mode, p_sample))
    DELETE FROM usage_samples d WHERE d.novel_id = p_novel AND d.seq NOT IN (SELECT k.seq FROM kept k);
    INSERT INTO usage_totals (novel_id, mode, samples, totals) VALUES (p_novel, p_mode, 1, p_totals)
    ON CONFLICT (novel_id, mode) DO UPDATE SET samples = usage_totals.samples + 1, totals = EXCLUDED.totals;
    RETURN 'recorded';
END $$;
