-- The tables the running build declares, with the fingerprint of what
-- decides what replicas hold of each (`magic_sync_core::schema`), written
-- when a relay starts. The operator's reads name only these: what a replica
-- says of any other table is counted under one name, so a replica cannot
-- grow the reads or the metrics' series by inventing names.
CREATE TABLE sync.tables (
    name        text        PRIMARY KEY,
    mirror      text        NOT NULL,
    fingerprint bytea       NOT NULL CHECK (length(fingerprint) = 32),
    -- When the fingerprint last changed.
    declared_at timestamptz NOT NULL DEFAULT now()
);
