-- Each replica's secret, kept as a password hash (a PHC string): a transport
-- checks the secret a connecting replica presents against it. The secret
-- itself is never stored; a replica without a row cannot connect.
CREATE TABLE sync.credentials (
    replica text        PRIMARY KEY,
    hash    text        NOT NULL,
    set_at  timestamptz NOT NULL DEFAULT now()
);
