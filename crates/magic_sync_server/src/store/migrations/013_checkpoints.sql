-- Uploads whose replica waits to read its own writes. A row is written
-- once the upload's filing committed and before it is answered, so a pass
-- that sees the row sees every change committed before the answer. The
-- first pass that keeps the replica up and sees it writes the replica a
-- `Reached` message after everything it planned, and records its number
-- in `message`; the row goes once the replica acknowledged that message.
-- A replica provisioned again meanwhile loses its outbox: its rows go back
-- to no message, and are reached again after its snapshot.
CREATE TABLE sync.checkpoints (
    replica text   NOT NULL,
    send_id bytea  NOT NULL,
    message bigint,
    at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (replica, send_id)
);
