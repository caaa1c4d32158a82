-- Each replica's public key on a broker (magic_sync_nats): what the
-- broker's configuration lets in. Only the public key is kept; the seed is
-- handed to the replica once, when it is enrolled. The broker's
-- `authorization` block is written from this table, so enrolling or
-- revoking a replica is a row here, then the block written again and the
-- broker reloaded.
CREATE TABLE sync.broker_keys (
    replica     text PRIMARY KEY,
    public_key  text NOT NULL,
    set_at      timestamptz NOT NULL DEFAULT now()
);
