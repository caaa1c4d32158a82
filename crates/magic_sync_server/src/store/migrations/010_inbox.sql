-- Rows of uploads the server refused to file, kept as they came with why:
-- a catalog written, another replica's record, a two-way row the replica
-- does not hold, a row PostgreSQL refused. The upload is answered all the
-- same (the replica lets go of the row); the row is the server's to show
-- (health) and to file again once a fix is deployed. One entry per row and
-- replica: a row refused again replaces its entry.
--   data: the row's bytes as the replica's codec wrote them; NULL for a
--         key the replica said is gone.
CREATE TABLE sync.inbox (
    replica    text        NOT NULL,
    table_name text        NOT NULL,
    key        text        NOT NULL,
    data       bytea,
    reason     text        NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (replica, table_name, key)
);
