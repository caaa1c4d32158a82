-- Notes the planner cannot plan: a key (or the parents it names) that no
-- longer fits its table's columns, written before the table changed type
-- under it. Planning casts every key, so one such note would fail every
-- pass; a pass that fails on a data exception moves them here with why,
-- and a relay starting moves them back (`relay/parked.rs`).
CREATE TABLE sync.parked (
    seq        bigint      NOT NULL,
    table_name text        NOT NULL,
    source     text        NOT NULL,
    key        jsonb       NOT NULL,
    parents    jsonb,
    xid        xid8        NOT NULL,
    format     smallint    NOT NULL,
    reason     text        NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);

-- Whether `value` casts to `type`: PostgreSQL 15 has no pg_input_is_valid.
-- A subtransaction a call, so it is used only to find notes that fail.
CREATE FUNCTION sync.castable(value text, type text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF value IS NULL THEN
        RETURN true;
    END IF;
    EXECUTE format('SELECT %L::%s', value, type);
    RETURN true;
EXCEPTION WHEN data_exception THEN
    RETURN false;
END
$$;
