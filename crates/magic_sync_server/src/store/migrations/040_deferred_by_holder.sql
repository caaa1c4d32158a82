-- A change kept for a holder (008) may be kept for a cohort (036): the
-- rows its view saw notes of, until a pass plans them (decision 176). Its
-- id is no replica's, so the link to sync.replicas goes, as the blocks'
-- went (037); forgetting replicas deletes what was kept for them.
ALTER TABLE sync.deferred DROP CONSTRAINT deferred_replica_fkey;
