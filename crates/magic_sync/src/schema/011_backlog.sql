-- What each replica last said it has that the server does not: per table,
-- rows written and not sent, and rows sent and not filed yet, as
-- {"table": {"unsent": n, "unfiled": n}}; and when it said so. Written when
-- an upload that carries it is filed; a replica with nothing left says so
-- with an empty object.
ALTER TABLE sync.replicas
    ADD COLUMN backlog jsonb,
    ADD COLUMN backlog_at timestamptz;
