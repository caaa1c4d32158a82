-- Rows that cannot go down: a row whose codec refuses it, or that no
-- message could carry, is set aside here, with why, instead of failing
-- every pass. `version` is the newest note of it the failing plan saw (0:
-- none, or found by a snapshot): a newer note means the row changed, and
-- it is tried again. `settled` says a pass has taken it back from every
-- replica that held an older version, with what points at it there.
CREATE TABLE sync.quarantine (
    table_name text NOT NULL,
    key        text COLLATE "C" NOT NULL,
    version    bigint NOT NULL,
    reason     text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    settled    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (table_name, key)
);

-- Rows a replica is not sent, or has taken back, because they point
-- (directly or through rows like them) at a row in quarantine: `root_*`
-- names that row. They are planned again when their root is let go, or
-- when they change themselves.
CREATE TABLE sync.blocked (
    replica    text NOT NULL REFERENCES sync.replicas (id) ON DELETE CASCADE,
    table_name text NOT NULL,
    key        text COLLATE "C" NOT NULL,
    root_table text NOT NULL,
    root_key   text COLLATE "C" NOT NULL,
    settled    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (replica, table_name, key)
);
-- A changed row finds its blocks; a released root, the rows it held back.
CREATE INDEX blocked_row ON sync.blocked (table_name, key);
CREATE INDEX blocked_root ON sync.blocked (root_table, root_key);
