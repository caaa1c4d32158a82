-- Notes: one row per change of a mirrored row, written by the engine's
-- triggers in the writer's own transaction. A note is deleted once the pass
-- that planned it has recorded what it asked for, so the table holds only
-- what is pending and the relay reads it whole. It has no index on purpose:
-- every write of a mirrored table pays for each index here, and an index
-- costs about a tenth of a single-row update's throughput (BENCHMARKS.md).
-- Numbers are unique because they come from the sequence.
CREATE SEQUENCE sync.note_seq AS bigint;

CREATE TABLE sync.notes (
    seq        bigint NOT NULL DEFAULT nextval('sync.note_seq'),
    -- The table as the engine knows it (a partitioned table by its own name).
    table_name text   NOT NULL,
    -- The relation the row was in when it changed (a partition's own name).
    source     text   NOT NULL,
    -- The row's key, a JSON array in the order the table declares it.
    key        jsonb  NOT NULL,
    -- The foreign-key columns the row held before the change, by column name;
    -- NULL when the row did not exist before it.
    parents    jsonb,
    -- The writing transaction.
    xid        xid8   NOT NULL DEFAULT pg_current_xact_id(),
    -- The layout of this note; a build skips notes of a layout it does not know.
    format     smallint NOT NULL DEFAULT 1
);
