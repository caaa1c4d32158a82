-- The down path's record: which replicas exist, what each holds, and the
-- messages written for them that the transport has not taken yet.

-- Message numbers. A sequence never goes back and is not rolled back, so no
-- two messages share a number.
CREATE SEQUENCE sync.message_seq AS bigint;

-- Replicas as the relay last observed them.
CREATE TABLE sync.replicas (
    id              text PRIMARY KEY,
    live            boolean NOT NULL,
    partition_id    text,
    -- Set when the next pass provisions the replica from scratch.
    provision       boolean NOT NULL DEFAULT true,
    -- The last message written for it: the next one names it as previous.
    last_number     bigint NOT NULL DEFAULT 0,
    last_nonce      bytea NOT NULL DEFAULT ''::bytea,
    -- The first message of the latest snapshot written for it.
    snapshot_number bigint NOT NULL DEFAULT 0,
    -- The last message it said it applied, under a seal that verified.
    acked_number    bigint NOT NULL DEFAULT 0,
    acked_at        timestamptz,
    -- Why the last send to it failed, if it did.
    last_error      text,
    observed_at     timestamptz NOT NULL DEFAULT now()
);

-- What each replica holds, as recorded: a row, the newest note of it the
-- recording pass saw (0: none pending), and the message that carried it.
-- A row counts as held once the replica acknowledged that message.
CREATE TABLE sync.held (
    replica    text   NOT NULL,
    table_name text   NOT NULL,
    key        jsonb  NOT NULL,
    version    bigint NOT NULL,
    message    bigint NOT NULL,
    -- Row first: a change looks up every replica holding its row.
    PRIMARY KEY (table_name, key, replica)
);
-- Per replica: forgetting one, counting what it holds. Not on `message` or
-- `version`: a row sent again then updates in place (a HOT update).
CREATE INDEX held_by_replica ON sync.held (replica);

-- Message bodies, each stored once however many replicas' messages carry it.
CREATE TABLE sync.bodies (
    id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hash  bytea NOT NULL UNIQUE,
    bytes bytea NOT NULL
);
-- Bodies are protobuf, mostly short-lived: not worth compressing.
ALTER TABLE sync.bodies ALTER COLUMN bytes SET STORAGE EXTERNAL;

-- Messages written and not yet taken by the transport, in order per replica.
-- The bytes sent are head || body || seal: protobuf fields in field order.
CREATE TABLE sync.outbox (
    replica  text   NOT NULL,
    number   bigint NOT NULL,
    nonce    bytea  NOT NULL,
    head     bytea  NOT NULL,
    body     bigint NOT NULL,
    seal     bytea  NOT NULL,
    PRIMARY KEY (replica, number)
);
CREATE INDEX outbox_body ON sync.outbox (body);
