-- Waking the relay when a change commits, instead of polling for notes.
--
-- A NOTIFY makes the transactions that send one commit one at a time: the
-- notification queue stays locked from before each commit record is written
-- until after it is flushed. So a writer notifies only while the relay
-- dozes (it found nothing to do and waits to be woken); a relay at work
-- reads every committed note at its next pass anyway. The state between
-- sessions is carried by two advisory locks, which write nothing:
--
--   DOZING  (7886752244608820581), held exclusively by the relay while it
--           waits to be woken;
--   WRITING (7886752339081131109), held shared to its end by a transaction
--           that wrote a note, taken before it looks at DOZING.
--
-- A writer that finds DOZING held notifies when it commits. One that finds
-- it free took WRITING first, so `sync.doze()`, which takes DOZING and then
-- looks at WRITING, either finds it still in flight (the relay polls until
-- it ends) or finds that every such writer has ended; then any note one
-- of them committed is there for it to see.

-- A note trigger calls this once per transaction (it sets
-- `magic_sync.noted`, which the trigger checks first).
CREATE FUNCTION sync.note_written() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(7886752339081131109);
    IF pg_try_advisory_lock_shared(7886752244608820581) THEN
        PERFORM pg_advisory_unlock_shared(7886752244608820581);
    ELSE
        PERFORM pg_notify('magic_sync_notes', '');
    END IF;
    PERFORM set_config('magic_sync.noted', 'on', true);
END
$$;

-- The relay, with nothing to do: 'writing' while a writer that did not see
-- it dozing is in flight, 'noted' when a note waits, else 'dozing', and
-- then it holds DOZING until `sync.wake()`. Each statement here reads the
-- database as it is when it runs, in a transaction at READ COMMITTED.
CREATE FUNCTION sync.doze() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock(7886752244608820581);
    IF NOT pg_try_advisory_lock(7886752339081131109) THEN
        PERFORM pg_advisory_unlock(7886752244608820581);
        RETURN 'writing';
    END IF;
    PERFORM pg_advisory_unlock(7886752339081131109);
    IF EXISTS (SELECT 1 FROM sync.notes WHERE format = 1) THEN
        PERFORM pg_advisory_unlock(7886752244608820581);
        RETURN 'noted';
    END IF;
    RETURN 'dozing';
END
$$;

CREATE FUNCTION sync.wake() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_unlock(7886752244608820581);
END
$$;
