-- Keys read by their record alone, not by their rule (decision 176): a
-- key with a note parked (024). The parked note is no longer pending, so
-- the rule read at a holder's position would put it past a change that
-- never went; from the moment the note is parked until a pass plans it
-- (moved back by a relay starting) or none of the key's notes is parked,
-- the record says who holds the key, and the holders the rule could have
-- given it to are provisioned again when it is first parked.
CREATE TABLE sync.ruled_out (
    table_name text  NOT NULL,
    key        jsonb NOT NULL,
    PRIMARY KEY (table_name, key)
);

-- Refuses a note the reading by rule cannot read, as a data exception, so
-- that the pass parks it (`store::parked`): its key or parents no longer
-- fit its table's columns. Called only for such a note.
CREATE FUNCTION sync.unfit(table_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'data_exception',
        MESSAGE = format('a note of %s names a key or parents that do not fit its columns', table_name);
END $$;
