-- The runner's figures, a row per period (`Settings::figures_every`, 5 s
-- by default), kept an hour and deleted as new ones come: what an
-- operator's page draws the fleet's history from. Counts are of the period
-- alone; lags are of the acknowledgements heard in it (commit of the oldest
-- change a message carried to the replica saying it applied it); the rest
-- is the record as the period ended.
CREATE TABLE sync.figures (
    at            timestamptz PRIMARY KEY,
    seconds       double precision NOT NULL,
    messages      bigint NOT NULL,
    rows_sent     bigint NOT NULL,
    uploads_filed bigint NOT NULL,
    acknowledged  bigint NOT NULL,
    lag_p50_ms    double precision,
    lag_p99_ms    double precision,
    pending_notes bigint NOT NULL,
    provisioning  bigint NOT NULL,
    live          bigint NOT NULL
);
