//! Domains and enums: a column of a domain is checked and read by the type
//! it is over, an enum as text, an array by its elements. The server starts
//! with declarations over them, a replica holds their values exactly, and a
//! replica's records of them are filed.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use magic_sync::envelope::Up;
use magic_sync::file::{self, Filing};
use magic_sync::sql::ident;
use magic_sync::{check, lite, Engine, Error, Numeric, Row};
use magic_sync_testkit::fleet::Fleet;
use std::time::Duration;

const TYPES: &str = "
CREATE DOMAIN year AS integer CHECK (VALUE BETWEEN 1901 AND 2155);
CREATE DOMAIN recent_year AS year CHECK (VALUE >= 2000);
CREATE DOMAIN release_day AS date;
CREATE DOMAIN film_code AS text CHECK (VALUE ~ '^[A-Z]{3}[0-9]+$');
CREATE DOMAIN showing_id AS bigint;
CREATE DOMAIN till_name AS text;
CREATE DOMAIN flag AS boolean NOT NULL;
CREATE DOMAIN poster AS bytea;
CREATE DOMAIN moment AS timestamptz;
CREATE DOMAIN wall_clock AS timestamp;
CREATE TYPE mpaa_rating AS ENUM ('G', 'PG', 'PG-13', 'R', 'NC-17');
CREATE TYPE region AS ENUM ('north', 'south');
";

const SCHEMA: &str = "
CREATE TABLE guides (
    rating mpaa_rating PRIMARY KEY,
    blurb  text NOT NULL
);
CREATE TABLE films (
    code         film_code PRIMARY KEY,
    release_year year NOT NULL,
    remastered   recent_year,
    released     release_day,
    rating       mpaa_rating NOT NULL REFERENCES guides,
    ratings      mpaa_rating[] NOT NULL,
    sequels      year[],
    reels        integer[] NOT NULL,
    restored     flag,
    poster       poster,
    added        moment,
    shot         wall_clock
);
CREATE TABLE showings (
    id     showing_id PRIMARY KEY,
    region region NOT NULL,
    film   film_code NOT NULL REFERENCES films
);
CREATE TABLE tickets (
    id      bigint PRIMARY KEY,
    till    till_name NOT NULL,
    seat    text NOT NULL,
    showing bigint NOT NULL REFERENCES showings
);
CREATE TABLE reviews (
    till     text NOT NULL,
    id       bigint NOT NULL,
    rating   mpaa_rating NOT NULL,
    seen_in  year NOT NULL,
    seen_on  release_day,
    PRIMARY KEY (till, id)
);
INSERT INTO guides VALUES
    ('G', 'for everyone'), ('PG', 'some guidance'), ('R', 'restricted'), ('NC-17', 'adults');
INSERT INTO films VALUES
    ('ABC1', 1994, 2014, '1994-09-23', 'R', '{R,PG-13}', '{1995,2003}', '{1,2,3}', true,
     '\\x00ff10', '2024-03-01 12:34:56.123456+00', '1999-12-31 23:59:59.999999'),
    ('XYZ2', 1901, NULL, NULL, 'G', '{}', NULL, '{}', false, NULL, NULL, NULL);
INSERT INTO showings VALUES (1, 'north', 'ABC1'), (2, 'south', 'XYZ2');
INSERT INTO tickets VALUES (10, 'u1', 'A1', 1), (11, 'u2', 'B2', 1);
";

/// Keyed by an enum; travels only as what a film points at.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "guides", down, referenced, key(rating))]
struct Guide {
    rating: String,
    blurb: String,
}

/// Every kind a domain or an enum can be read as, and arrays of them; keyed
/// by a domain over text, pointing at a key of an enum.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "films", down, all, key(code))]
struct Film {
    code: String,
    release_year: i32,
    remastered: Option<i32>,
    released: Option<NaiveDate>,
    rating: String,
    ratings: Vec<String>,
    sequels: Option<Vec<i32>>,
    reels: Vec<i64>,
    /// Its domain is NOT NULL, so the field need not be an `Option`.
    restored: bool,
    poster: Option<Vec<u8>>,
    added: Option<DateTime<Utc>>,
    shot: Option<NaiveDateTime>,
}

/// Partitioned by an enum, keyed by a domain over bigint, pointing at a
/// key of a domain.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "showings", down, partition = "region", key(id))]
struct Showing {
    id: i64,
    region: String,
    film: String,
}

/// Given to the replica a domain over text names; a bigint pointing at a
/// key of a domain over bigint.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "tickets", down, replica = "till", key(id))]
struct Ticket {
    id: i64,
    till: String,
    seat: String,
    showing: i64,
}

/// A replica's record with an enum and domains.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "reviews", up, key(till, id))]
struct Review {
    #[row(origin)]
    till: String,
    id: i64,
    rating: String,
    seen_in: i32,
    seen_on: Option<NaiveDate>,
}

fn engine() -> Engine {
    Engine::builder()
        .table::<Guide>()
        .table::<Film>()
        .table::<Showing>()
        .table::<Ticket>()
        .table::<Review>()
        .build()
        .expect("the declarations")
}

/// A fleet over the schema, with a replica in the north (`u1`) and one in
/// the south (`u2`), provisioned and checked.
async fn fleet() -> Fleet {
    let mut fleet = Fleet::of(&format!("{TYPES}{SCHEMA}"), engine()).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("south"));
    fleet.sync().await;
    fleet.check().await;
    fleet
}

/// The rows of `R` a replica holds, as its struct, in key order.
fn held<R: Row>(fleet: &mut Fleet, unit: &str) -> Vec<R> {
    let table = &R::TABLE;
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| ident(n))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let columns: Vec<&str> = table.columns.iter().map(|c| c.name).collect();
    let sql = format!(
        "SELECT {} FROM {} ORDER BY {}",
        list(&columns),
        ident(table.name),
        list(table.key)
    );
    let replica = &fleet.unit(unit).replica;
    let mut stmt = replica.connection().prepare(&sql).unwrap();
    let rows = stmt
        .query_map([], |row| Ok(lite::read_row(row, 0, table).unwrap()))
        .unwrap();
    rows.map(|values| R::from_values(values.unwrap()).expect("the row fits its struct"))
        .collect()
}

fn abc1() -> Film {
    Film {
        code: "ABC1".into(),
        release_year: 1994,
        remastered: Some(2014),
        released: NaiveDate::from_ymd_opt(1994, 9, 23),
        rating: "R".into(),
        ratings: vec!["R".into(), "PG-13".into()],
        sequels: Some(vec![1995, 2003]),
        reels: vec![1, 2, 3],
        restored: true,
        poster: Some(vec![0x00, 0xff, 0x10]),
        added: Some(
            DateTime::parse_from_rfc3339("2024-03-01T12:34:56.123456Z")
                .unwrap()
                .with_timezone(&Utc),
        ),
        shot: NaiveDateTime::parse_from_str("1999-12-31T23:59:59.999999", "%Y-%m-%dT%H:%M:%S%.f")
            .ok(),
    }
}

fn xyz2() -> Film {
    Film {
        code: "XYZ2".into(),
        release_year: 1901,
        remastered: None,
        released: None,
        rating: "G".into(),
        ratings: vec![],
        sequels: None,
        reels: vec![],
        restored: false,
        poster: None,
        added: None,
        shot: None,
    }
}

#[tokio::test]
async fn a_server_starts_with_fields_over_domains_enums_and_their_arrays() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client
        .batch_execute(&format!("{TYPES}{SCHEMA}"))
        .await
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    magic_sync::trigger::install(&engine(), &mut client)
        .await
        .unwrap();
    let catalog = check::startup(&engine(), &client).await.expect("starts");
    let films = catalog.relation("public", "films").unwrap();
    let column = |name: &str| {
        let c = films.column(name).unwrap();
        (c.type_name.as_str(), c.base_type.as_str(), c.not_null)
    };
    assert_eq!(column("code"), ("film_code", "text", true));
    assert_eq!(column("release_year"), ("year", "integer", true));
    assert_eq!(column("remastered"), ("recent_year", "integer", false));
    assert_eq!(column("rating"), ("mpaa_rating", "text", true));
    assert_eq!(column("ratings"), ("mpaa_rating[]", "text[]", true));
    assert_eq!(column("sequels"), ("year[]", "integer[]", false));
    assert_eq!(column("reels"), ("integer[]", "integer[]", true));
    assert_eq!(column("restored"), ("flag", "boolean", true));
}

#[tokio::test]
async fn a_provisioned_replica_holds_domain_and_enum_values_exactly() {
    let mut fleet = fleet().await;
    let guide = |rating: &str, blurb: &str| Guide {
        rating: rating.into(),
        blurb: blurb.into(),
    };
    for unit in ["u1", "u2"] {
        assert_eq!(held::<Film>(&mut fleet, unit), vec![abc1(), xyz2()]);
        // The guides the films point at, and no other.
        assert_eq!(
            held::<Guide>(&mut fleet, unit),
            vec![guide("G", "for everyone"), guide("R", "restricted")]
        );
    }
    // A change travels as a provisioning did, with the guide it points at
    // now, and the one it no longer does let go of.
    fleet
        .settle(
            "UPDATE films SET rating = 'NC-17', ratings = '{NC-17,G}', release_year = 2155,
                              sequels = '{1901}', released = '2000-02-29'
             WHERE code = 'XYZ2'",
        )
        .await;
    let changed = Film {
        rating: "NC-17".into(),
        ratings: vec!["NC-17".into(), "G".into()],
        release_year: 2155,
        sequels: Some(vec![1901]),
        released: NaiveDate::from_ymd_opt(2000, 2, 29),
        ..xyz2()
    };
    assert_eq!(held::<Film>(&mut fleet, "u1"), vec![abc1(), changed]);
    assert_eq!(
        held::<Guide>(&mut fleet, "u1"),
        // In a replica an enum is text, and sorts as text.
        vec![guide("NC-17", "adults"), guide("R", "restricted")]
    );
}

#[tokio::test]
async fn a_partition_of_an_enum_and_a_replica_of_a_domain_give_each_replica_its_rows() {
    let mut fleet = fleet().await;
    let showing = |id: i64, region: &str, film: &str| Showing {
        id,
        region: region.into(),
        film: film.into(),
    };
    assert_eq!(
        held::<Showing>(&mut fleet, "u1"),
        vec![showing(1, "north", "ABC1")]
    );
    // The south holds the north's showing too: its ticket points at it.
    assert_eq!(
        held::<Showing>(&mut fleet, "u2"),
        vec![showing(1, "north", "ABC1"), showing(2, "south", "XYZ2")]
    );
    let ticket = |id: i64, till: &str, seat: &str| Ticket {
        id,
        till: till.into(),
        seat: seat.into(),
        showing: 1,
    };
    assert_eq!(
        held::<Ticket>(&mut fleet, "u1"),
        vec![ticket(10, "u1", "A1")]
    );
    assert_eq!(
        held::<Ticket>(&mut fleet, "u2"),
        vec![ticket(11, "u2", "B2")]
    );
    // A showing moved to the south goes there; a ticket given to the other
    // till goes to it.
    fleet
        .settle(
            "UPDATE showings SET region = 'south' WHERE id = 1;
             UPDATE tickets SET till = 'u2' WHERE id = 10",
        )
        .await;
    assert_eq!(held::<Showing>(&mut fleet, "u1"), vec![]);
    assert_eq!(
        held::<Showing>(&mut fleet, "u2"),
        vec![showing(1, "south", "ABC1"), showing(2, "south", "XYZ2")]
    );
    assert_eq!(held::<Ticket>(&mut fleet, "u1"), vec![]);
    assert_eq!(
        held::<Ticket>(&mut fleet, "u2"),
        vec![ticket(10, "u2", "A1"), ticket(11, "u2", "B2")]
    );
}

/// The till's upload, filed as its own.
async fn upload(fleet: &mut Fleet, till: &str) -> (usize, Vec<String>) {
    let up: Up = fleet
        .unit(till)
        .replica
        .upload(1 << 20, Duration::from_secs(3600))
        .unwrap()
        .expect("something to upload");
    let mut client = fleet.db.connect().await;
    let filing = file::file(&mut client, &fleet.engine, &till.into(), &up)
        .await
        .expect("the upload is filed");
    match filing {
        Filing::Filed {
            taken,
            refused,
            answer,
            ..
        } => {
            fleet.unit(till).replica.filed(&answer).unwrap();
            (taken, refused.into_iter().map(|r| r.reason).collect())
        }
        Filing::Waits { reason } => panic!("the upload waits: {reason}"),
    }
}

#[tokio::test]
async fn a_record_with_an_enum_and_domains_is_filed_and_one_they_refuse_is_refused_alone() {
    let mut fleet = fleet().await;
    fleet
        .unit("u1")
        .replica
        .connection()
        .execute_batch(
            "INSERT INTO reviews VALUES ('u1', 1, 'PG-13', 1994, '1994-10-01');
             INSERT INTO reviews VALUES ('u1', 2, 'G', 2001, NULL);
             INSERT INTO reviews VALUES ('u1', 3, 'X', 2001, NULL);
             INSERT INTO reviews VALUES ('u1', 4, 'R', 1800, NULL);",
        )
        .unwrap();
    let (taken, refused) = upload(&mut fleet, "u1").await;
    assert_eq!(taken, 2, "{refused:?}");
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused
            .iter()
            .any(|r| r.contains("invalid input value for enum mpaa_rating")),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|r| r.contains("value for domain year violates check constraint")),
        "{refused:?}"
    );
    let filed: Vec<(String, i64, String, i32, Option<NaiveDate>)> = fleet
        .writer
        .query(
            "SELECT till, id, rating::text, seen_in, seen_on::date FROM reviews ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(
        filed,
        [
            (
                "u1".into(),
                1,
                "PG-13".into(),
                1994,
                NaiveDate::from_ymd_opt(1994, 10, 1)
            ),
            ("u1".into(), 2, "G".into(), 2001, None),
        ]
    );
    // The down path goes on as before.
    fleet.sync().await;
    fleet.check().await;
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "films", down, all, key(code))]
struct FilmMistyped {
    code: String,
    release_year: String,
    remastered: Option<i32>,
    released: Option<NaiveDate>,
    rating: i32,
    ratings: Vec<i64>,
    sequels: Option<Vec<String>>,
    reels: Vec<i64>,
    restored: bool,
    poster: Option<Vec<u8>>,
    added: Option<DateTime<Utc>>,
    shot: Option<NaiveDateTime>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "films", down, all, key(code))]
struct FilmWithRequiredRemaster {
    code: String,
    release_year: i32,
    remastered: i32,
    released: Option<NaiveDate>,
    rating: String,
    ratings: Vec<String>,
    sequels: Option<Vec<i32>>,
    reels: Vec<i64>,
    restored: bool,
    poster: Option<Vec<u8>>,
    added: Option<DateTime<Utc>>,
    shot: Option<NaiveDateTime>,
}

/// What the start-up check says refusing `engine` over a database of its
/// own holding `schema`.
async fn refused_over(schema: &str, engine: Engine) -> String {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(schema).await.unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let err = check::startup(&engine, &client).await.expect_err("refused");
    assert!(matches!(err, Error::Declarations(_)), "{err}");
    err.to_string()
}

#[tokio::test]
async fn a_field_that_does_not_fit_a_domain_or_an_enum_names_both_types() {
    let schema = format!("{TYPES}{SCHEMA}");
    let engine = Engine::builder().table::<FilmMistyped>().build().unwrap();
    let m = refused_over(&schema, engine).await;
    for expected in [
        "column `release_year`: the field is text, which does not fit the column's type year (a domain over integer)",
        "column `rating`: the field is i32, which does not fit the column's type mpaa_rating (an enum, checked as text)",
        "column `ratings`: the field is array of i64, which does not fit the column's type mpaa_rating[] (an array of an enum, checked as text[])",
        "column `sequels`: the field is array of text, which does not fit the column's type year[] (an array of a domain over integer)",
    ] {
        assert!(m.contains(expected), "expected {expected:?} in:\n{m}");
    }
    // A domain without NOT NULL is as nullable as the type it is over.
    let engine = Engine::builder()
        .table::<FilmWithRequiredRemaster>()
        .build()
        .unwrap();
    let m = refused_over(&schema, engine).await;
    assert!(
        m.contains("column `remastered`: the column can be NULL, but its field is not an Option"),
        "{m}"
    );
    assert!(!m.contains("column `restored`"), "{m}");
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "rates", down, all, key(code))]
struct Rate {
    code: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "tabs", down, all, key(id))]
struct Tab {
    id: i64,
    rate: Numeric,
}

#[tokio::test]
async fn a_foreign_key_of_a_domain_is_compared_by_the_type_it_is_over() {
    let engine = Engine::builder()
        .table::<Rate>()
        .table::<Tab>()
        .build()
        .unwrap();
    let m = refused_over(
        "CREATE DOMAIN price AS numeric(10, 2);
         CREATE TABLE rates (code numeric(12, 4) PRIMARY KEY);
         CREATE TABLE tabs (id bigint PRIMARY KEY, rate price NOT NULL REFERENCES rates);",
        engine,
    )
    .await;
    assert!(
        m.contains(
            "table `tabs`, column `rate`: foreign key `tabs_rate_fkey` is price (a domain over \
             numeric(10,2)) but points at `rates.code`, which is numeric(12,4)"
        ),
        "{m}"
    );
}
