-- Whether a replica verifies messages signed in a batch (one signature over
-- the root of a Merkle tree of every message published together, decision
-- 165), as its newest acknowledgement said. A replica of an earlier build
-- never says so, and is sent each message signed on its own.
ALTER TABLE sync.acks ADD COLUMN reads_batches boolean NOT NULL DEFAULT false;
