-- When a build's note functions replaced an earlier build's (`replaced`,
-- the transactions in progress then): notes those functions wrote say no
-- kind (038) and may lack what a reading by rule needs, and a transaction
-- in progress then may still commit some. A relay told to leave rows to
-- their rule records every row until no such note is pending and every
-- one of those transactions has ended (decision 176, the upgrade).
ALTER TABLE sync.record_form ADD COLUMN replaced pg_snapshot;
