-- The current definition of every step function (HOUSE-4): the one place to read and change them.
--
-- Migrations (store/migrations/: the baseline, then the changes after it, HOUSE-8) hold tables,
-- indexes, constraints and triggers. The step functions' bodies live here only. `store.migrate`
-- applies this file after the migrations, under the same advisory lock and in one transaction,
-- whenever its SHA-256 differs from the one stored in `schema_functions` (and never against a
-- schema newer than the process knows, OPS-10): it drops every step function by name (whatever
-- its signature) and the outcome type, and creates them as written below. To change a function,
-- edit it here; a migration never defines one.
--
-- A step function does, inside the database and in one statement (PERF-2), what a store function
-- would do with BEGIN, a novel-row lock, several reads, its writes and COMMIT. It answers with an
-- outcome (`nb_outcome`, the same list as `novelbus.store.outcomes.Outcome`) and the facts a
-- message needs; it never raises a domain error: the Python store function raises the typed one.
-- Every statement in a function runs after the novel-row lock is held, so it sees what the lock
-- serialises (READ COMMITTED takes a new snapshot per statement in a VOLATILE function).

-- OPS-9: who may execute a step function (store/grants.py) outlives its re-creation: the grants
-- are kept for this transaction here and given back at the end of this file.
SELECT set_config('novelbus.step_grants', coalesce(
    (SELECT jsonb_agg(DISTINCT jsonb_build_array(p.proname, a.grantee::regrole::text))::text
     FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'nb\_%'
       AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)), '[]'), true);

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname = ANY (ARRAY['nb_claim_unit', 'nb_prepare_unit', 'nb_prepare_lease_unit',
                                          'nb_account_turn', 'nb_record_turn_usage', 'nb_commit_write',
                                          'nb_commit_body', 'nb_commit_body_event'])
    LOOP
        EXECUTE 'DROP FUNCTION ' || f;
    END LOOP;
END $$;
DROP TYPE IF EXISTS nb_outcome CASCADE;  -- and any function still answering with it

-- HOUSE-4: every answer a step function gives. tests/store/test_outcomes.py holds it equal to
-- novelbus.store.outcomes.Outcome (same values, same order).
CREATE TYPE nb_outcome AS ENUM (
    'novel-not-found', 'not-active', 'finished', 'outline-missing', 'scene-not-found', 'revision-conflict',
    'watermark-conflict', 'requirements-open', 'in-flight', 'unit-not-found', 'not-claimable', 'not-claimed',
    'token-mismatch', 'existing', 'exhausted', 'prepared', 'claimed', 'check', 'committed', 'changed',
    'duplicate', 'recorded'
);

-- prepare_unit: the unit of (chapter, scene, fragment), or a new one under the first free id of
-- `p_candidates`; 'exhausted' when all of them are taken (the caller sends the next candidates).
-- The scene is looked up by key in `outline_scenes` (listed when the revision is written).
CREATE FUNCTION nb_prepare_unit(
    p_novel text, p_chapter text, p_scene text, p_fragment integer, p_anchor text, p_candidates text[]
) RETURNS TABLE (o_outcome nb_outcome, o_unit text) LANGUAGE plpgsql AS $$
DECLARE
    n novels%ROWTYPE;
    v_candidate text;
BEGIN
    SELECT * INTO n FROM novels WHERE novel_id = p_novel FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'novel-not-found'::nb_outcome, NULL::text;
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
    IF NOT EXISTS (SELECT 1 FROM outline_revisions r WHERE r.novel_id = p_novel AND r.revision = n.outline_revision) THEN
        o_outcome := 'outline-missing';
    ELSIF NOT EXISTS (SELECT 1 FROM outline_scenes s WHERE s.novel_id = p_novel AND s.revision = n.outline_revision
                      AND s.chapter_id = p_chapter AND s.scene_id = p_scene) THEN
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

-- The driver's steps before a claim in one statement: prepare the unit (nb_prepare_unit, same
-- outcomes), append its `unit.prepared` ledger row (the outbox: the caller publishes it under the
-- row's seq), record the driver's intent (DRV-1) and lease the unit under it (REL-1) — the same
-- conditional writes as store.record_intent_and_lease. One transaction after the novel-row lock:
-- a kill leaves all or nothing. p_event_type NULL: no ledger row. The payload's `unit_id` is set
-- to the unit prepared (the id is chosen here, among p_candidates).
CREATE FUNCTION nb_prepare_lease_unit(
    p_novel text, p_chapter text, p_scene text, p_fragment integer, p_anchor text, p_candidates text[],
    p_intent text, p_notice text, p_holder text, p_secs double precision,
    p_event_type text, p_event_payload jsonb
) RETURNS TABLE (o_outcome nb_outcome, o_unit text, o_event_seq bigint, o_leased boolean)
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

-- STORE-1 claim: novel active, outline present, expected revision, expected watermark, no
-- requirement open, no other unit claimed, unit prepared — in this order (SPEC §16 Claim).
CREATE FUNCTION nb_claim_unit(
    p_novel text, p_unit text, p_token_hash text, p_claim_id text, p_mode text, p_intent text,
    p_claimed_by text, p_expected_revision text, p_expected_watermark integer
) RETURNS TABLE (
    o_outcome nb_outcome, o_attempt integer, o_detail text, o_status text, o_revision text,
    o_watermark integer, o_pending integer, o_blocked integer, o_dispatch_limit jsonb
) LANGUAGE plpgsql AS $$
DECLARE
    n novels%ROWTYPE;
    v_attempt integer;
    v_other text;
BEGIN
    SELECT * INTO n FROM novels WHERE novel_id = p_novel FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'novel-not-found'::nb_outcome, NULL::integer, NULL::text, NULL::text, NULL::text,
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

-- STORE-2 commit, in SPEC §16 order, under the novel-row lock. The state checks are here:
--   'novel-not-found'; 'existing' (the unit has a commit: its receipt facts, for the caller's
--   duplicate / conflict / token decision); 'unit-not-found'; 'not-claimed' (o_detail: the state);
--   'token-mismatch'. The body's checks are novel.commitcheck.check_body's, in its order, and
--   nowhere else: this function only gathers what they need from the book and answers 'check'
--   (o_known, o_committed, o_length) when one of them fails here (the hard length maximum, a canon
--   source naming an unknown commit or a paragraph it does not have) or when p_write is false (the
--   caller already knows the body fails a check that needs no database) — the caller then runs
--   check_body with those facts, which raises the exact error. Else 'committed': the commit, its
--   canon facts with 'inline' sources — passed as '@…' — pointing at the new commit id (STORE-3),
--   and the unit marked committed.
-- p_refs: [[commit id, highest paragraph index referenced or -1], ...] of the canon sources.
CREATE FUNCTION nb_commit_body(
    p_novel text, p_unit text, p_token_hash text, p_body jsonb, p_body_hash text, p_chars integer,
    p_context_hash text, p_run_id text, p_canon jsonb, p_refs jsonb, p_write boolean DEFAULT true
) RETURNS TABLE (
    o_outcome nb_outcome, o_detail text, o_seq integer, o_claim_id text, o_committed bigint, o_length jsonb,
    o_known jsonb, e_commit_id text, e_token_hash text, e_body_hash text, e_chars integer,
    e_context_hash text, e_completed boolean, e_total bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_length jsonb;
    v_hard_max bigint;
    e commits%ROWTYPE;
    u units%ROWTYPE;
    v_next integer;
    v_commit text;
BEGIN
    SELECT n.config -> 'length' INTO v_length FROM novels n WHERE n.novel_id = p_novel FOR UPDATE;
    IF NOT FOUND THEN
        o_outcome := 'novel-not-found';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO e FROM commits c WHERE c.novel_id = p_novel AND c.unit_id = p_unit;
    IF FOUND THEN
        o_outcome := 'existing'; e_commit_id := e.commit_id; o_claim_id := e.claim_id;
        e_token_hash := e.token_hash; e_body_hash := e.body_hash; e_chars := e.effective_chars;
        e_context_hash := e.context_hash; e_completed := (e.body -> 'sceneCompletion' ->> 'completed')::boolean;
        e_total := e.total_chars;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO u FROM units x WHERE x.novel_id = p_novel AND x.unit_id = p_unit FOR UPDATE;
    IF NOT FOUND THEN
        o_outcome := 'unit-not-found';
    ELSIF u.state <> 'claimed' THEN
        o_outcome := 'not-claimed'; o_detail := u.state;
    ELSIF u.token_hash IS DISTINCT FROM p_token_hash THEN
        o_outcome := 'token-mismatch';
    END IF;
    IF o_outcome IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT c.total_chars, c.seq + 1 INTO o_committed, v_next
    FROM commits c WHERE c.novel_id = p_novel ORDER BY c.seq DESC LIMIT 1;
    IF NOT FOUND THEN
        o_committed := 0; v_next := 1;
    END IF;
    -- novel.outline.LengthBudget: kind 'target' unless said otherwise; no hard maximum unless set.
    IF COALESCE(v_length ->> 'kind', 'target') <> 'unbounded'
            AND jsonb_typeof(v_length -> 'hardMaximumCharacters') = 'number' THEN
        v_hard_max := (v_length ->> 'hardMaximumCharacters')::bigint;
    END IF;
    SELECT COALESCE(jsonb_object_agg(c.commit_id, c.paragraph_count), '{}'::jsonb)
    INTO o_known
    FROM commits c WHERE c.novel_id = p_novel  -- key lookups of the referenced commits only
      AND c.commit_id = ANY (ARRAY(SELECT r ->> 0 FROM jsonb_array_elements(p_refs) r));
    IF NOT p_write OR (v_hard_max IS NOT NULL AND p_chars > v_hard_max - o_committed) OR EXISTS (
            SELECT 1 FROM jsonb_array_elements(p_refs) r
            WHERE NOT (o_known ? (r ->> 0)) OR (r ->> 1)::bigint >= (o_known ->> (r ->> 0))::bigint) THEN
        o_outcome := 'check'; o_length := v_length;
        RETURN NEXT;
        RETURN;
    END IF;
    v_commit := 'commit-' || v_next;
    INSERT INTO commits (novel_id, seq, commit_id, unit_id, chapter_id, scene_id, claim_id, token_hash, body,
                         body_hash, effective_chars, context_hash, run_id)
    VALUES (p_novel, v_next, v_commit, p_unit, u.chapter_id, u.scene_id, u.claim_id, p_token_hash, p_body,
            p_body_hash, p_chars, p_context_hash, p_run_id);
    INSERT INTO canon_facts (novel_id, commit_id, idx, kind, summary, detail, sources, character_ids,
                             foreshadowing_id, foreshadowing_status)
    SELECT p_novel, v_commit, (f.ord - 1)::integer, f.e ->> 'kind', f.e ->> 'summary', f.e ->> 'detail',
           (SELECT COALESCE(jsonb_agg(CASE WHEN left(s.v, 1) = '@' THEN to_jsonb(v_commit || substr(s.v, 2))
                                           ELSE to_jsonb(s.v) END ORDER BY s.i), '[]'::jsonb)
            FROM jsonb_array_elements_text(f.e -> 'sources') WITH ORDINALITY AS s(v, i)),
           f.e -> 'character_ids', f.e ->> 'foreshadowing_id', f.e ->> 'foreshadowing_status'
    FROM jsonb_array_elements(p_canon) WITH ORDINALITY AS f(e, ord);
    UPDATE units SET state = 'committed', updated_at = now()
    WHERE novel_id = p_novel AND unit_id = p_unit AND state = 'claimed' AND token_hash = p_token_hash;
    o_outcome := 'committed'; o_seq := v_next; o_claim_id := u.claim_id;
    RETURN NEXT;
END $$;

-- A unit's commit and its `unit.committed` ledger row in one statement: nb_commit_body (same
-- outcomes) and, only when it wrote the commit ('committed'), the event row in the same
-- transaction: a kill leaves both or neither. The row carries the event's once-key p_once_key
-- (REL-7: actors.context.once_key_of_commit), so it exists once per unit whoever writes it; a
-- replay ('existing') writes no row. The payload's commitId, effectiveCharacters,
-- totalCharacters and bodySha256 are set here. The caller publishes the row under o_event_seq.
CREATE FUNCTION nb_commit_body_event(
    p_novel text, p_unit text, p_token_hash text, p_body jsonb, p_body_hash text, p_chars integer,
    p_context_hash text, p_run_id text, p_canon jsonb, p_refs jsonb,
    p_event_type text, p_event_payload jsonb, p_once_key text
) RETURNS TABLE (
    o_outcome nb_outcome, o_detail text, o_seq integer, o_claim_id text, o_committed bigint, o_length jsonb,
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

-- USE-1, REL-2, REL-7 a turn's usage sample, the write half: the caller read the mode's totals
-- (`p_samples` samples; NULL: none yet) and added the sample to them (store.usage.add_totals).
-- Under the novel's usage lock: 'changed' when the totals moved since (nothing written; the caller
-- reads again); 'duplicate' when the turn's usage was already settled or the message was seen;
-- else 'recorded': the turn is marked sampled (when it was accounted), the message processed
-- (when keyed), the sample enters the ring (the last `p_ring` kept) and the totals are replaced.
CREATE FUNCTION nb_record_turn_usage(
    p_novel text, p_turn_key text, p_message_key text, p_mode text, p_sample jsonb, p_ring integer,
    p_samples integer, p_totals jsonb
) RETURNS nb_outcome LANGUAGE plpgsql AS $$
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

-- OPS-9: a step function runs as its owner, the migration role (SECURITY DEFINER): it takes the
-- novel-row lock and writes what a claim or a commit writes, which its callers' roles may not do
-- directly; the search path is pinned, and only the roles granted it (store/grants.py) call it.
DO $$
DECLARE
    f regprocedure;
    g jsonb;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname = ANY (ARRAY['nb_claim_unit', 'nb_prepare_unit', 'nb_prepare_lease_unit',
                                          'nb_account_turn', 'nb_record_turn_usage', 'nb_commit_body',
                                          'nb_commit_body_event'])
    LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    FOR g IN SELECT jsonb_array_elements(coalesce(nullif(current_setting('novelbus.step_grants', true), ''), '[]')::jsonb)
    LOOP
        FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = g ->> 0
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, g ->> 1);
        END LOOP;
    END LOOP;
END $$;
