-- novelbus schema, version 007: a unit's commit in one round trip (PERF-2).
--
-- store.commit_body first runs every check of the body that needs nothing from the database
-- (novel.commitcheck.check_body with every commit known and no length limit). When those pass,
-- this function does the rest, under the novel-row lock, in STORE-2 / SPEC §16 order:
--   'novel-not-found'; 'existing' (the unit has a commit: its receipt facts, for the caller's
--   duplicate / conflict / token decision); 'unit-not-found'; 'not-claimed' (o_detail: the state);
--   'token-mismatch'; 'check' (a check that needs the database fails: the hard length maximum,
--   or a canon source naming an unknown commit or a paragraph it does not have — the caller runs
--   check_body again with o_known / o_committed / o_length, which raises the exact error);
--   'committed' (written: the commit, its canon facts with 'inline' sources — passed as '@…' —
--   pointing at the new commit id (STORE-3), and the unit marked committed).
-- p_refs: [[commit id, highest paragraph index referenced or -1], ...] of the canon sources.
CREATE FUNCTION nb_commit_body(
    p_novel text, p_unit text, p_token_hash text, p_body jsonb, p_body_hash text, p_chars integer,
    p_context_hash text, p_run_id text, p_canon jsonb, p_refs jsonb
) RETURNS TABLE (
    o_outcome text, o_detail text, o_seq integer, o_claim_id text, o_committed bigint, o_length jsonb,
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
        SELECT COALESCE(SUM(p.effective_chars), 0) INTO e_total FROM commits p
        WHERE p.novel_id = p_novel AND p.seq <= e.seq;
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
    SELECT COALESCE(SUM(c.effective_chars), 0), COALESCE(MAX(c.seq), 0) + 1 INTO o_committed, v_next
    FROM commits c WHERE c.novel_id = p_novel;
    -- novel.outline.LengthBudget: kind 'target' unless said otherwise; no hard maximum unless set.
    IF COALESCE(v_length ->> 'kind', 'target') <> 'unbounded'
            AND jsonb_typeof(v_length -> 'hardMaximumCharacters') = 'number' THEN
        v_hard_max := (v_length ->> 'hardMaximumCharacters')::bigint;
    END IF;
    SELECT COALESCE(jsonb_object_agg(c.commit_id, jsonb_array_length(c.body -> 'paragraphs')), '{}'::jsonb)
    INTO o_known
    FROM commits c WHERE c.novel_id = p_novel
      AND c.commit_id IN (SELECT r ->> 0 FROM jsonb_array_elements(p_refs) r);
    IF (v_hard_max IS NOT NULL AND p_chars > v_hard_max - o_committed) OR EXISTS (
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
