-- A replica's outbox is bounded. What counts is what it is owed beyond the
-- snapshot its outbox begins with: `snapshot_last` is the last message of
-- the latest snapshot written for it. Past the bound the outbox is dropped
-- and the replica provisioned again, and `alarm` says so, and when.
ALTER TABLE sync.replicas
    ADD COLUMN snapshot_last bigint NOT NULL DEFAULT 0,
    ADD COLUMN alarm text,
    ADD COLUMN alarm_at timestamptz;
