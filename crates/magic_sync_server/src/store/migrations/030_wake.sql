-- Waking the relay when a change commits, instead of polling for notes.
--
-- A NOTIFY makes the transactions that send one commit one at a time: the
-- notification queue stays locked from before each commit record is written
-- until after it is flushed. So a writer notifies only while the relay
-- dozes (it found nothing to do and waits to be woken); a relay at work
-- reads every committed note at its next pass anyway. Whether it dozes is
-- told by one advisory lock, which writes nothing: DOZING
-- (7886752244608820581), held exclusively by a dozing relay.
--
-- Each note trigger tries to take DOZING shared, for the rest of its
-- transaction. Refused, the relay dozes, and the writer notifies on commit.
-- Granted, the writer holds it to its end, so the relay cannot begin to
-- doze while a writer that found it at work is in flight: that writer will
-- not notify, and the relay polls until it has ended. When the relay does
-- take DOZING, every such writer has ended, and one more look sees the
-- notes they committed.

-- The relay, with nothing to do: 'writing' while a writer that found it at
-- work is in flight, 'noted' when a note waits, else 'dozing', and then it
-- holds DOZING until `sync.wake()`. The look at the notes reads the
-- database as it is once DOZING is held (a statement of its own, at READ
-- COMMITTED: the caller's transaction is).
CREATE FUNCTION sync.doze() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_lock(7886752244608820581) THEN
        RETURN 'writing';
    END IF;
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
