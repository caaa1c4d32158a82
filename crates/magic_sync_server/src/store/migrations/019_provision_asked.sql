-- A replica provisioned again at its own request (a gap it reported, an
-- acknowledgement of another epoch or beyond what it was sent) is so at
-- most once a `Settings::provision_asked_every`: `provision_asked` says the
-- snapshot it waits for is of its asking, `asked_at` when the last such
-- snapshot began.
ALTER TABLE sync.replicas
    ADD COLUMN provision_asked boolean NOT NULL DEFAULT false,
    ADD COLUMN asked_at timestamptz;
