-- Per row a replica holds of a two-way table, the replica's upload (its
-- sequence number) the server last took the replica's own columns from. An
-- upload filed after a newer one (delivered out of order) then changes
-- nothing, instead of putting an older value back. NULL: none taken yet.
-- Nullable and without a default, so adding it rewrites nothing.
ALTER TABLE sync.held ADD COLUMN filed bigint;
