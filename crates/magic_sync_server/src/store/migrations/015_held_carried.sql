-- How many held rows each message carried last, per replica and table:
-- the rows a replica has on their way are those of its messages after the
-- one it acknowledged. Counting them from `sync.held` visits every such
-- row where it lies in the heap (6 s for 200 replicas with 3M rows all
-- unconfirmed); read from here it is a few rows per message. Kept by a
-- statement trigger, so no path that writes `sync.held` can forget it,
-- and exact within each transaction that writes it.
CREATE TABLE sync.held_carried (
    replica    text    NOT NULL,
    message    bigint  NOT NULL,
    table_name text    NOT NULL,
    rows       bigint  NOT NULL,
    PRIMARY KEY (replica, message, table_name)
);

CREATE FUNCTION sync.held_carried_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO sync.held_carried AS c (replica, message, table_name, rows)
        SELECT replica, message, table_name, count(*) FROM new_rows GROUP BY 1, 2, 3
        ON CONFLICT (replica, message, table_name) DO UPDATE SET rows = c.rows + excluded.rows;
    ELSIF TG_OP = 'DELETE' THEN
        -- Every count a row left exists: it goes down, or goes.
        WITH m AS (
            SELECT replica, message, table_name, count(*) AS n FROM old_rows GROUP BY 1, 2, 3),
        gone AS (
            DELETE FROM sync.held_carried c USING m
            WHERE c.replica = m.replica AND c.message = m.message
              AND c.table_name = m.table_name AND c.rows = m.n)
        UPDATE sync.held_carried c SET rows = c.rows - m.n FROM m
        WHERE c.replica = m.replica AND c.message = m.message
          AND c.table_name = m.table_name AND c.rows <> m.n;
    ELSE
        -- A row sent again moves from its old message to its new one; an
        -- update that moves nothing nets to zero and writes nothing.
        WITH m AS (
            SELECT replica, message, table_name, sum(n) AS n FROM (
                SELECT replica, message, table_name, 1 AS n FROM new_rows
                UNION ALL
                SELECT replica, message, table_name, -1 FROM old_rows) moved
            GROUP BY 1, 2, 3 HAVING sum(n) <> 0),
        gone AS (
            DELETE FROM sync.held_carried c USING m
            WHERE c.replica = m.replica AND c.message = m.message
              AND c.table_name = m.table_name AND c.rows + m.n = 0),
        kept AS (
            UPDATE sync.held_carried c SET rows = c.rows + m.n FROM m
            WHERE c.replica = m.replica AND c.message = m.message
              AND c.table_name = m.table_name AND c.rows + m.n <> 0)
        INSERT INTO sync.held_carried (replica, message, table_name, rows)
        SELECT replica, message, table_name, n FROM m
        WHERE NOT EXISTS (
            SELECT 1 FROM sync.held_carried c
            WHERE c.replica = m.replica AND c.message = m.message AND c.table_name = m.table_name);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER held_carried_insert AFTER INSERT ON sync.held
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sync.held_carried_count();
CREATE TRIGGER held_carried_update AFTER UPDATE ON sync.held
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sync.held_carried_count();
CREATE TRIGGER held_carried_delete AFTER DELETE ON sync.held
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sync.held_carried_count();

-- A truncated record counts nothing (the engine never truncates it; an
-- operator might).
CREATE FUNCTION sync.held_carried_clear() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE sync.held_carried;
    RETURN NULL;
END $$;
CREATE TRIGGER held_carried_truncate AFTER TRUNCATE ON sync.held
    FOR EACH STATEMENT EXECUTE FUNCTION sync.held_carried_clear();

INSERT INTO sync.held_carried
SELECT replica, message, table_name, count(*) FROM sync.held GROUP BY 1, 2, 3;
