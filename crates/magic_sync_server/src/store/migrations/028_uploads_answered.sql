-- Per replica, the newest upload (its `Up.sequence`) the runner answered
-- as filed, recorded before the answer goes. A replica says in each
-- acknowledgement the newest one it was answered (`Ack.answered`); more
-- than recorded here means the database was restored from a copy older
-- than filings it answered, which it forgot: a new epoch begins, every
-- replica is provisioned again, and each sends up again what it wrote.
CREATE TABLE sync.uploads_answered (
    replica  text   PRIMARY KEY,
    sequence bigint NOT NULL
);
