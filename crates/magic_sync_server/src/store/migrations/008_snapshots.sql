-- Snapshots stream beside the passes, each in a REPEATABLE READ transaction
-- of its own on a connection of its own.
--   snapshot_attempt: while a replica's snapshot streams, the attempt under
--                     way; its worker records what it sent only while the
--                     attempt is still this one (a pass that observed the
--                     replica move or leave, or a relay that started since,
--                     ends it by clearing the column).
--   snapshot:         what the replica's latest snapshot saw
--                     (pg_current_snapshot()), recorded when it ended.
-- A replica with `provision` and no attempt waits for a snapshot; one with
-- an attempt streams; one with neither is kept up by the passes.
ALTER TABLE sync.replicas
    ADD COLUMN snapshot pg_snapshot,
    ADD COLUMN snapshot_attempt bytea,
    ADD COLUMN snapshot_began_at timestamptz;

-- Changes kept for a replica whose snapshot streams: every pass that plans
-- notes meanwhile keeps here, for that replica, the rows they changed, at
-- the newest note and its transaction. The first pass after the snapshot
-- ended plans for the replica the rows whose transaction the snapshot did
-- not see, and lets go of the others (they are in the snapshot).
CREATE TABLE sync.deferred (
    replica    text   NOT NULL REFERENCES sync.replicas (id) ON DELETE CASCADE,
    table_name text   NOT NULL,
    key        jsonb  NOT NULL,
    seq        bigint NOT NULL,
    xid        xid8   NOT NULL,
    PRIMARY KEY (replica, table_name, key)
);
