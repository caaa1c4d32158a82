-- What each replica said it applied, in a table of its own. Replicas speak
-- all the time (every message they apply); a pass rewrites `sync.replicas`
-- rows as it writes messages. Kept apart, acknowledgements are recorded on
-- a connection of their own, beside a pass, and neither ever rewrites a row
-- under the other's snapshot.
CREATE TABLE sync.acks (
    replica text   PRIMARY KEY REFERENCES sync.replicas (id) ON DELETE CASCADE,
    -- The last message it said it applied, under a seal that verified.
    number  bigint NOT NULL,
    at      timestamptz NOT NULL
);

INSERT INTO sync.acks (replica, number, at)
SELECT id, acked_number, coalesce(acked_at, now()) FROM sync.replicas WHERE acked_number > 0;

ALTER TABLE sync.replicas DROP COLUMN acked_number, DROP COLUMN acked_at;
