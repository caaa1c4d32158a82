-- When a replica's last snapshot was recorded as sent. A snapshot streams
-- past the outbox, so one lost on the way whole (a replica's first, with
-- nothing acknowledged ever) shows no gap: the outbox check provisions it
-- again once nothing was acknowledged for a while after this.
ALTER TABLE sync.replicas ADD COLUMN snapshot_ended_at timestamptz;
