-- The fingerprint of the declarations whose description of the replica's
-- tables (their columns, keys and the foreign keys among them) each
-- replica was last sent: a relay of other declarations sends its own to
-- every replica kept up before anything else.
ALTER TABLE sync.replicas ADD COLUMN described bytea;
