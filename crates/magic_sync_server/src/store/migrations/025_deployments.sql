-- Deployments: what a build changed in the declarations, worked through
-- beside the passes (`deploy.rs`, `relay/deployment.rs`).
--
-- `plan_print` is the fingerprint of what decides which replicas hold which
-- rows of a table (its rule, key, direction and the links it points
-- through); `fingerprint` keeps covering that and how its rows are encoded.
-- `definition` keeps what a later build needs to take a table's rows back
-- once it no longer declares it: its key columns' kinds and the links its
-- held rows count in their parents.
ALTER TABLE sync.tables
    ADD COLUMN plan_print bytea CHECK (length(plan_print) = 32),
    ADD COLUMN definition jsonb,
    -- The relations whose writes are noted for this table: itself, and a
    -- group rule's members and grants tables.
    ADD COLUMN noted text[];

-- One row per table a deployment changed. `work` says what is owed:
--   plan    its rows are planned again against what each replica holds
--           (a new table, a changed rule or links): only the difference goes;
--   resend  sent again to every replica holding them, as they are held
--           (the encoding changed, and nothing that decides who holds them);
--   both    planned again as with `plan`, and sent again to every replica
--           that keeps them (the rule and the encoding changed);
--   remove  its rows are taken back from every replica, from the record
--           alone (the build no longer declares it).
-- `after` is the key of the last row worked through (NULL: none yet), so a
-- relay stopped mid-deployment goes on from there.
CREATE TABLE sync.deployment (
    table_name  text        PRIMARY KEY,
    work        text        NOT NULL CHECK (work IN ('plan', 'resend', 'both', 'remove')),
    why         text        NOT NULL,
    definition  jsonb,
    after       jsonb,
    rows_done   bigint      NOT NULL DEFAULT 0,
    -- Rows to work through, as estimated when the deployment began.
    rows_total  bigint      NOT NULL DEFAULT 0,
    -- The fingerprint of the declarations of the build that owes it: only a
    -- relay of that build works it (an older one still running while the
    -- new one starts must not plan it under its own declarations).
    build       bytea       NOT NULL DEFAULT ''::bytea,
    began_at    timestamptz NOT NULL DEFAULT now(),
    done_at     timestamptz
);

-- The fingerprint of the declarations each replica was last told it holds
-- whole (a snapshot's end, or a `Configured` once a deployment is done);
-- NULL: not told yet under any build.
ALTER TABLE sync.replicas ADD COLUMN configured bytea;
