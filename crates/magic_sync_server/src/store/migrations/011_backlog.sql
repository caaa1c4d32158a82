-- What each replica last said it has that the server does not: per table,
-- rows written and not sent, and rows sent and not filed yet, as
-- {"table": {"unsent": n, "unfiled": n}}; and when it said so. Written when
-- an upload that carries it is filed; a replica with nothing left says so
-- with an empty object. A table of its own, not a column of sync.replicas:
-- uploads are filed beside the passes, and a pass's REPEATABLE READ update
-- of a replica's row would fail on every row a filing had changed since.
CREATE TABLE sync.backlogs (
    replica text        PRIMARY KEY,
    tables  jsonb       NOT NULL,
    at      timestamptz NOT NULL DEFAULT now()
);
