-- The record by rule (how-it-works §20, docs/record-by-rule-plan.md): what
-- many replicas hold alike is recorded once, for a cohort, rather than once
-- per replica. These tables come before the relay writes them, so that each
-- later step lands on a schema already in place; until then they stay empty.

-- A cohort: the rows one rule value selects, closed over the rows they
-- need, which every member holds alike. Its rows are recorded in sync.held
-- under its id as the holder; an id begins with a control character, which
-- no replica id may (the relay refuses such an id when the host lists it).
CREATE TABLE sync.cohorts (
    id           text   PRIMARY KEY,
    -- The rules that select it. The first step records the cohort of the
    -- tables whose rule is `all`.
    kind         text   NOT NULL CHECK (kind IN ('all')),
    -- Its newest message: a member's chain reaches it once the member
    -- joined before it.
    newest       bigint NOT NULL DEFAULT 0,
    newest_nonce bytea,
    -- Its messages up to here were acknowledged by every member, and are
    -- forgotten.
    floor        bigint NOT NULL DEFAULT 0
);

-- Which replicas hold which cohort, and from where: a member is owed the
-- cohort's messages numbered past both its acknowledgement and `since`, the
-- number its chain stood at when it joined (with that message's nonce, the
-- `previous` of the first message it is owed).
CREATE TABLE sync.members (
    replica     text   NOT NULL REFERENCES sync.replicas (id) ON DELETE CASCADE,
    cohort      text   NOT NULL REFERENCES sync.cohorts (id) ON DELETE CASCADE,
    since       bigint NOT NULL,
    since_nonce bytea  NOT NULL,
    PRIMARY KEY (replica, cohort)
);
CREATE INDEX members_by_cohort ON sync.members (cohort, replica);

-- A cohort's messages, written once for all its members. Each member is
-- sent them under a head made for it: this number, a nonce derived from
-- this one and the member, and its own previous message.
CREATE TABLE sync.batches (
    cohort    text   NOT NULL REFERENCES sync.cohorts (id) ON DELETE CASCADE,
    number    bigint NOT NULL,
    -- The last number of the pass that wrote it: a member with a message
    -- of its own at that number was sent that pass's rows in its own
    -- messages, and is not owed this one.
    pass_last bigint NOT NULL,
    nonce     bytea  NOT NULL,
    body      bigint NOT NULL,
    PRIMARY KEY (cohort, number)
);
CREATE INDEX batches_body ON sync.batches (body);

-- A batch deleted may free its body, as a message deleted does (031).
CREATE TRIGGER batches_freed AFTER DELETE ON sync.batches
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION sync.outbox_freed();

-- The nonce of the message each replica last acknowledged: a member's
-- chain may continue from its acknowledgement, and the next message names
-- both its number and its nonce. NULL for what was acknowledged before.
ALTER TABLE sync.acks ADD COLUMN nonce bytea;
