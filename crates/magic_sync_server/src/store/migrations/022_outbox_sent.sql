-- A message stays in the outbox until the replica acknowledges it, not only
-- until the transport took it: a message lost after the transport took it,
-- the last one a replica was sent, opens no gap the replica could see, so
-- nothing but sending it again brings the replica what it carried. `sent_at`
-- says when the transport last took it; publishing sends what was never
-- sent, and again what went unacknowledged for a while.
ALTER TABLE sync.outbox ADD COLUMN sent_at timestamptz;
