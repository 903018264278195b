-- novelbus schema, version 013 (issue 14): what a unit's statements read stops growing with the book.
--
-- 1. `units_written`: a read that holds the units of an earlier snapshot asks only for those
--    written since (`store.commit_index`); without this index that still visited every unit of
--    the novel, in four reads per unit. A range scan from the old snapshot's xmin (computed once
--    per read: `store.snapshots.unit_rows_json`) reads only the units written since.
-- 2. `commits.total_chars` (the book's effective characters through this commit) and
--    `commits.paragraph_count`, set by a trigger on insert (and on a change of the body): the
--    commit, the verifier's receipt, the reconciliation sweep and the context read summed every
--    earlier commit, or read every commit's body (its prose) to count its paragraphs, once
--    per unit. Commits are written once, in seq order under the novel-row lock (seq = max + 1),
--    and never deleted, so the previous commit's total plus this one's is the running sum.
-- 3. `nb_prepare_unit` finds the unit's scene in the outline by containment.

CREATE INDEX units_written ON units (novel_id, written_xid);

ALTER TABLE commits ADD COLUMN total_chars bigint, ADD COLUMN paragraph_count integer;

UPDATE commits c SET total_chars = t.total, paragraph_count = COALESCE(jsonb_array_length(c.body -> 'paragraphs'), 0)
FROM (SELECT novel_id, seq, SUM(effective_chars) OVER (PARTITION BY novel_id ORDER BY seq) AS total
      FROM commits) t
WHERE t.novel_id = c.novel_id AND t.seq = c.seq;

ALTER TABLE commits ALTER COLUMN total_chars SET NOT NULL, ALTER COLUMN paragraph_count SET NOT NULL;

CREATE FUNCTION nb_commit_totals() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.paragraph_count := COALESCE(jsonb_array_length(NEW.body -> 'paragraphs'), 0);
    IF TG_OP = 'INSERT' THEN
        NEW.total_chars := NEW.effective_chars + COALESCE((SELECT p.total_chars FROM commits p
            WHERE p.novel_id = NEW.novel_id AND p.seq < NEW.seq ORDER BY p.seq DESC LIMIT 1), 0);
    ELSIF NEW.effective_chars IS DISTINCT FROM OLD.effective_chars OR NEW.seq IS DISTINCT FROM OLD.seq THEN
        RAISE EXCEPTION 'a commit''s characters and seq are written once (commit %)', OLD.commit_id;
    ELSE
        NEW.total_chars := OLD.total_chars;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER commits_totals BEFORE INSERT OR UPDATE ON commits
    FOR EACH ROW EXECUTE FUNCTION nb_commit_totals();

-- The prepare function of migration 006, finding the scene in the outline by containment (one
-- pass in C over the outline's scenes) instead of a set-returning walk that extracted two text
-- fields per scene: with 800 scenes that walk was ≈ 1 ms of every unit.
CREATE OR REPLACE FUNCTION nb_prepare_unit(
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
    ELSIF NOT (v_outline -> 'scenes') @> jsonb_build_array(jsonb_build_object('sceneId', p_scene, 'chapterId', p_chapter)) THEN
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

-- The commit function of migration 007, reading the running total and the referenced commits'
-- paragraph counts from those columns instead of summing and counting over the book, and the
-- referenced commits by key (= ANY of an array) rather than as a semi-join.
CREATE OR REPLACE FUNCTION nb_commit_body(
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
