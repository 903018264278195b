-- novelbus schema, version 014 (issue 14): the prepare finds the unit's scene by key.
--
-- `nb_prepare_unit` checked that the unit's (chapter, scene) is in the novel's current outline
-- by reading the whole outline revision — a jsonb document that grows with the book, stored
-- compressed out of line — and searching its scenes, once per unit: at 600 scenes that was
-- most of the prepare's time. Outline revisions are written once and never changed, so their
-- scenes are listed once, when the revision is written (a trigger), in `outline_scenes`, and
-- the prepare looks its scene up by key. Existing revisions are listed by this migration.

CREATE TABLE outline_scenes (
    novel_id   text NOT NULL,
    revision   text NOT NULL,
    chapter_id text NOT NULL,
    scene_id   text NOT NULL,
    PRIMARY KEY (novel_id, revision, chapter_id, scene_id),
    FOREIGN KEY (novel_id, revision) REFERENCES outline_revisions (novel_id, revision)
);

-- The (chapter, scene) of each scene of an outline document.
CREATE FUNCTION nb_outline_scene_keys(p_outline jsonb) RETURNS TABLE (chapter_id text, scene_id text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT s ->> 'chapterId', s ->> 'sceneId'
    FROM jsonb_array_elements(COALESCE(p_outline -> 'scenes', '[]'::jsonb)) s
    WHERE s ->> 'chapterId' IS NOT NULL AND s ->> 'sceneId' IS NOT NULL
$$;

INSERT INTO outline_scenes (novel_id, revision, chapter_id, scene_id)
SELECT r.novel_id, r.revision, k.chapter_id, k.scene_id FROM outline_revisions r, nb_outline_scene_keys(r.outline) k
ON CONFLICT DO NOTHING;

CREATE FUNCTION nb_outline_scenes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN  -- the application never changes a revision; keep the list true anyway
        DELETE FROM outline_scenes WHERE novel_id = OLD.novel_id AND revision = OLD.revision;
    END IF;
    INSERT INTO outline_scenes (novel_id, revision, chapter_id, scene_id)
    SELECT NEW.novel_id, NEW.revision, k.chapter_id, k.scene_id FROM nb_outline_scene_keys(NEW.outline) k
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER outline_revisions_scenes AFTER INSERT OR UPDATE OF outline ON outline_revisions
    FOR EACH ROW EXECUTE FUNCTION nb_outline_scenes();

-- The prepare function of migration 013, with the scene found by key in `outline_scenes`.
CREATE OR REPLACE FUNCTION nb_prepare_unit(
    p_novel text, p_chapter text, p_scene text, p_fragment integer, p_anchor text, p_candidates text[]
) RETURNS TABLE (o_outcome text, o_unit text) LANGUAGE plpgsql AS $$
DECLARE
    n novels%ROWTYPE;
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
