-- Per row of a two-way table and replica, the replica's upload (its
-- sequence number) the server last took the replica's own columns from.
-- An upload filed after a newer one (delivered out of order) then changes
-- nothing, instead of putting an older value back. Kept apart from
-- sync.held, which the passes update: a filing never contends with them.
-- Numbers only grow, so an entry outliving the row it is about is harmless.
CREATE TABLE sync.filed (
    replica    text   NOT NULL,
    table_name text   NOT NULL,
    key        text   COLLATE "C" NOT NULL,
    sequence   bigint NOT NULL,
    PRIMARY KEY (table_name, key, replica)
);
