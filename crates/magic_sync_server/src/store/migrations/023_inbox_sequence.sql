-- A refused row is filed again when a relay starts (a fix may have been
-- deployed), and a two-way row's owned columns are taken only from an
-- upload newer than the last one taken for that row: the entry keeps the
-- sequence of the upload it came in, so filing it again never puts back a
-- value older than one filed since. 0 for entries kept before this column
-- (taken as they come, as an upload that does not say its sequence is).
ALTER TABLE sync.inbox ADD COLUMN sequence bigint NOT NULL DEFAULT 0;
