-- The record's form (decision 176): whether a row a holder's own rule
-- gives it may be held with no record row of its own (`by_rule`), its
-- holder's rule at its position saying it instead. A relay of a build
-- that records every row, or told to, provisions every replica again
-- before it reads a record left thinned; whoever else reads the record
-- (filing, digests, the operator's reads) reads by the rule too while it
-- is thinned.
CREATE TABLE sync.record_form (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    by_rule   boolean NOT NULL DEFAULT false
);

INSERT INTO sync.record_form DEFAULT VALUES;

-- Tables whose rows are all recorded for the time being, none left to their
-- rule: a deployment is changing their rule. Before the rule changes (when
-- the new build's triggers go in, or its relay starts), what the old rule
-- gives each holder is recorded; until the deployment of the table is done,
-- no relay thins it or reads it by a rule, old or new.
CREATE TABLE sync.recorded_whole (
    table_name text PRIMARY KEY,
    since      timestamptz NOT NULL DEFAULT now()
);
