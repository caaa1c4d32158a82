-- Epochs a replica can order. An epoch's id is now its generation (8
-- bytes, big-endian: above the epoch's before it, and never below the clock
-- in microseconds when it began) followed by 16 random bytes; a replica
-- refuses a message of an epoch older than the one it follows, so an old
-- snapshot replayed changes nothing. The epoch in use keeps its id (16
-- random bytes, ordered with none: drawing another would provision every
-- replica again), unless nothing was ever sent under it.
--
-- Epochs begun from now on take their secret from `master` and their id
-- (`magic_sync_core::seal::epoch_secret`): a server restored from a copy
-- older than an epoch its predecessor began still holds the master, so it
-- can check the seal of a message of that epoch a replica acknowledges,
-- and begin an epoch after it rather than offer replicas an older one.
ALTER TABLE sync.epoch DROP CONSTRAINT epoch_id_check;
ALTER TABLE sync.epoch ADD CONSTRAINT epoch_id_check CHECK (length(id) IN (16, 24));
ALTER TABLE sync.epoch ADD COLUMN master bytea;
UPDATE sync.epoch SET master = decode(replace(gen_random_uuid()::text || gen_random_uuid()::text
    || gen_random_uuid()::text, '-', ''), 'hex');
ALTER TABLE sync.epoch ALTER COLUMN master SET NOT NULL;
ALTER TABLE sync.epoch ADD CONSTRAINT epoch_master_check CHECK (length(master) >= 32);
UPDATE sync.epoch
SET id = int8send((extract(epoch FROM clock_timestamp()) * 1000000)::int8)
    || decode(replace(gen_random_uuid()::text, '-', ''), 'hex')
WHERE NOT EXISTS (SELECT 1 FROM sync.replicas) AND NOT EXISTS (SELECT 1 FROM sync.outbox);

-- A replica provisioned again at its own asking (a gap, an acknowledgement
-- the server cannot take, a digest that differs) waits before its next such
-- snapshot `Settings::provision_asked_every`, doubled for each it asked for
-- since it last went an hour without asking, up to an hour: one that asks
-- again and again costs the server a snapshot an hour, across reconnections
-- and whichever transport it comes through. `asked_times` counts them.
ALTER TABLE sync.replicas ADD COLUMN asked_times integer NOT NULL DEFAULT 0;
