-- Why each replica holds each row, recorded with it, so a change is planned
-- against what the replica holds and never by searching the host's tables:
--   ruled: its table's own rule sends it to the replica (else it is held
--          as the parent of a row the replica holds, or follows one);
--   ptrs:  what the version the replica holds points at, by link (the
--          child's foreign-key columns), each parent as its key;
--   refs:  how many rows the replica holds point at this one, over every
--          link recorded in ptrs.
-- A row held only for what points at it can then leave only when refs says
-- nothing the replica keeps points at it any more.
ALTER TABLE sync.held
    ADD COLUMN ruled boolean NOT NULL DEFAULT false,
    ADD COLUMN ptrs  jsonb,
    ADD COLUMN refs  integer NOT NULL DEFAULT 0;

-- What was recorded before says none of this: every live replica is
-- provisioned again, once, by the next pass (which drops its held rows and
-- outbox first).
UPDATE sync.replicas SET provision = true WHERE live;
