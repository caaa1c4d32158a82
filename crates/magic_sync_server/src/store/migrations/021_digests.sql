-- The backstop: a replica's digest of what it holds, compared with what
-- the server records it holding. `digest_compared_at` is when one was last
-- compared (at most one a minute is), `digest_differed_at` and
-- `digest_said` when and how the last one that differed did, and
-- `digest_mismatches` how many have: each provisioned it again.
ALTER TABLE sync.replicas
    ADD COLUMN digest_compared_at timestamptz,
    ADD COLUMN digest_differed_at timestamptz,
    ADD COLUMN digest_said text,
    ADD COLUMN digest_mismatches integer NOT NULL DEFAULT 0;
