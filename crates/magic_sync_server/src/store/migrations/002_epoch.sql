-- The installation's epoch: a random id and the secret messages are sealed
-- with. A new epoch replaces the row; replicas are provisioned again.
-- gen_random_uuid() draws from PostgreSQL's strong random source.
CREATE TABLE sync.epoch (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    id         bytea   NOT NULL CHECK (length(id) = 16),
    secret     bytea   NOT NULL CHECK (length(secret) >= 32),
    began_at   timestamptz NOT NULL DEFAULT now()
);

INSERT INTO sync.epoch (id, secret)
VALUES (
    decode(replace(gen_random_uuid()::text, '-', ''), 'hex'),
    decode(replace(gen_random_uuid()::text || gen_random_uuid()::text
        || gen_random_uuid()::text, '-', ''), 'hex')
);
