-- What each note says happened to its row: 'i' inserted, 'u' updated,
-- 'd' deleted, 'a' noted again by a relay starting (the row as it is).
-- NULL: written by a note function of an earlier build.
--
-- A note's `parents` is the row before the change, NULL for an insert; an
-- update's and a delete's look alike. Whether a key existed before its
-- pending notes is what is there now less the inserts plus the deletes,
-- which needs each note's kind: in one transaction a key inserted and then
-- updated notes (insert, update), and a key taken by another row's key
-- change under a deferrable unique key, then deleted, notes (insert,
-- delete). Decision 176 reads a holder's rows at its position this way.
ALTER TABLE sync.notes ADD COLUMN op "char";
ALTER TABLE sync.parked ADD COLUMN op "char";
