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
    -- Rows in, rows out, netted per message: a row sent again moves from
    -- its old message to the new one; an update that moves nothing nets
    -- to zero and writes nothing.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO sync.held_carried AS c (replica, message, table_name, rows)
        SELECT replica, message, table_name, count(*) FROM new_rows GROUP BY 1, 2, 3
        ON CONFLICT (replica, message, table_name) DO UPDATE SET rows = c.rows + excluded.rows;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE sync.held_carried c SET rows = c.rows - d.n
        FROM (SELECT replica, message, table_name, count(*) AS n FROM old_rows GROUP BY 1, 2, 3) d
        WHERE c.replica = d.replica AND c.message = d.message AND c.table_name = d.table_name;
    ELSE
        INSERT INTO sync.held_carried AS c (replica, message, table_name, rows)
        SELECT replica, message, table_name, sum(n) FROM (
            SELECT replica, message, table_name, 1 AS n FROM new_rows
            UNION ALL
            SELECT replica, message, table_name, -1 FROM old_rows) moved
        GROUP BY 1, 2, 3 HAVING sum(n) <> 0
        ON CONFLICT (replica, message, table_name) DO UPDATE SET rows = c.rows + excluded.rows;
    END IF;
    -- Only a count a row left can have come to nothing.
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM sync.held_carried c
        USING (SELECT DISTINCT replica, message, table_name FROM old_rows) o
        WHERE c.replica = o.replica AND c.message = o.message AND c.table_name = o.table_name
          AND c.rows = 0;
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

INSERT INTO sync.held_carried
SELECT replica, message, table_name, count(*) FROM sync.held GROUP BY 1, 2, 3;
