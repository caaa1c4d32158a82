-- A row held back from a holder (020) may be held back from a cohort
-- (036), whose id is no replica's: the link to sync.replicas goes. What it
-- did on delete is done where replicas are forgotten, which deletes their
-- blocks with everything else recorded for them.
ALTER TABLE sync.blocked DROP CONSTRAINT blocked_replica_fkey;
