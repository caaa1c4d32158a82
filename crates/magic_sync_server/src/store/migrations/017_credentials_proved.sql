-- When each replica last proved its secret with a slow hash: a replica that
-- did so recently is given a share of the hashing capacity of its own, so a
-- flood of wrong secrets after a restart does not keep it out.
ALTER TABLE sync.credentials ADD COLUMN proved_at timestamptz;
