-- The server's signing keys (Ed25519 seeds), oldest first: every message
-- and answer to a replica is signed with the newest. A key after the first
-- carries its endorsement: a signature over it by the key before it, so a
-- replica that pinned an older key can follow the chain to the newest.
-- The first seed is the SHA-256 of three random UUIDs (366 random bits).
CREATE TABLE sync.keys (
    ordinal     integer PRIMARY KEY CHECK (ordinal >= 1),
    seed        bytea   NOT NULL CHECK (length(seed) = 32),
    endorsement bytea   CHECK ((ordinal = 1) = (endorsement IS NULL)),
    made_at     timestamptz NOT NULL DEFAULT now()
);

INSERT INTO sync.keys (ordinal, seed)
VALUES (1, sha256(decode(replace(gen_random_uuid()::text || gen_random_uuid()::text
    || gen_random_uuid()::text, '-', ''), 'hex')));
