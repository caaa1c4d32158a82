//! The schema tests: what fingerprints alike and what does not, the
//! encoding written out by hand, and descriptions read back, refused
//! and compared.

use super::{ForeignKey, Schema};
use crate::{Engine, Row};
use sha2::Digest;

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "unit_id", key(id))]
struct Order {
    id: i64,
    unit_id: String,
    customer_id: Option<i64>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "customers", down, referenced, key(id))]
struct Customer {
    id: i64,
    name: String,
}

mod renamed {
    use crate::Row;

    // The same table as `Order`, declared by another struct.
    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "orders", down, replica = "unit_id", key(id))]
    pub struct Purchase {
        pub id: i64,
        pub unit_id: String,
        pub customer_id: Option<i64>,
    }

    // `orders` with its customer column taking a text.
    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "orders", down, replica = "unit_id", key(id))]
    pub struct OrderByName {
        pub id: i64,
        pub unit_id: String,
        pub customer_id: Option<String>,
    }

    // `orders` sent by partition instead of by replica.
    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "orders", down, partition = "unit_id", key(id))]
    pub struct OrderByPartition {
        pub id: i64,
        pub unit_id: String,
        pub customer_id: Option<i64>,
    }
}

fn fk() -> ForeignKey {
    ForeignKey::new("orders", &["customer_id"], "customers", &["id"])
}

fn schema<R: Row>(fks: &[ForeignKey]) -> Schema {
    let engine = Engine::builder()
        .table::<Customer>()
        .table::<R>()
        .build()
        .unwrap();
    Schema::new(&engine, fks)
}

#[test]
fn what_replicas_cannot_tell_apart_fingerprints_alike() {
    let order = schema::<Order>(&[fk()]);
    // The struct's name is the host's, not the replica's.
    assert_eq!(
        order.fingerprint(),
        schema::<renamed::Purchase>(&[fk()]).fingerprint()
    );
    // A foreign key to an undeclared table is none of the schema's.
    let stray = ForeignKey::new("orders", &["unit_id"], "units", &["id"]);
    assert_eq!(
        order.fingerprint(),
        schema::<Order>(&[fk(), stray]).fingerprint()
    );
    assert_eq!(order.foreign_keys(), vec![fk()]);
}

#[test]
fn a_change_replicas_would_see_changes_that_tables_fingerprint_only() {
    let order = schema::<Order>(&[fk()]);
    let customers = order.table("customers").unwrap().fingerprint();
    for (what, other) in [
        ("a column's kind", schema::<renamed::OrderByName>(&[fk()])),
        ("the rule", schema::<renamed::OrderByPartition>(&[fk()])),
        ("a foreign key", schema::<Order>(&[])),
    ] {
        let (a, b) = (
            order.table("orders").unwrap(),
            other.table("orders").unwrap(),
        );
        assert_ne!(a.fingerprint(), b.fingerprint(), "{what}");
        assert_ne!(order.fingerprint(), other.fingerprint(), "{what}");
        assert_eq!(
            other.table("customers").unwrap().fingerprint(),
            customers,
            "{what} changes only `orders`"
        );
    }
}

#[test]
fn a_fingerprint_is_stable_from_build_to_build() {
    // Written down once: a change to the encoding shows here, since
    // every fingerprint a server stored would then differ from its
    // table's.
    let schema = schema::<Order>(&[fk()]);
    let customers = schema.table("customers").unwrap();
    assert_eq!(customers.rule, "referenced");
    // The encoding as the module documents it, written out by hand:
    // texts behind their lengths, a list's count before its items.
    fn part(bytes: &mut Vec<u8>, text: &str) {
        bytes.extend_from_slice(&(text.len() as u64).to_be_bytes());
        bytes.extend_from_slice(text.as_bytes());
    }
    let mut bytes = Vec::new();
    for text in [
        "table",
        "customers",
        "mirror",
        "down",
        "rule",
        "referenced",
        "column",
        "id",
        "kind",
        "i64",
        "nullable",
        "no",
        "column",
        "name",
        "kind",
        "text",
        "nullable",
        "no",
        "key",
    ] {
        part(&mut bytes, text);
    }
    bytes.extend_from_slice(&1u64.to_be_bytes());
    part(&mut bytes, "id");
    part(&mut bytes, "owned");
    bytes.extend_from_slice(&0u64.to_be_bytes());
    for text in ["version", "", "origin", "", "retired", "", "codec", "json"] {
        part(&mut bytes, text);
    }
    let by_hand: [u8; 32] = sha2::Sha256::digest(&bytes).into();
    assert_eq!(customers.fingerprint().0, by_hand);
    assert_eq!(
        customers.fingerprint().to_string(),
        "3f81bdc32de72fd10d1f000fb40806a2dd03d7b40b3900a361aa38eba9bbce28"
    );
}

mod written {
    use crate::Row;

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "stock", both, replica = "unit_id", key(unit_id, product_id))]
    pub struct Stock {
        pub unit_id: String,
        pub product_id: i64,
        pub on_hand: i32,
        #[row(owned)]
        pub counted: Option<i32>,
    }

    // `stock` whose replicas own another column.
    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "stock", both, replica = "unit_id", key(unit_id, product_id))]
    pub struct StockOwnedOtherwise {
        pub unit_id: String,
        pub product_id: i64,
        #[row(owned)]
        pub on_hand: i32,
        pub counted: Option<i32>,
    }

    #[derive(Row, Debug, Clone, PartialEq)]
    #[row(table = "sales", up, key(id), key_without_origin)]
    pub struct Sale {
        pub id: String,
        #[row(origin)]
        pub unit_id: String,
        pub tags: Vec<String>,
        #[row(version)]
        pub version: i64,
    }
}

fn whole<S: Row>() -> Schema {
    let engine = Engine::builder()
        .table::<Customer>()
        .table::<Order>()
        .table::<S>()
        .table::<written::Sale>()
        .build()
        .unwrap();
    Schema::new(&engine, &[fk()])
}

#[test]
fn a_description_gives_back_every_table_whole_and_adds_up_to_its_fingerprint() {
    let schema = whole::<written::Stock>();
    let described = schema.described();
    assert_eq!(Schema::from_described(&described), Ok(schema.clone()));
    let stock = described.tables.iter().find(|t| t.name == "stock").unwrap();
    assert_eq!(stock.owned, ["counted"]);
    let sales = described.tables.iter().find(|t| t.name == "sales").unwrap();
    assert_eq!(
        (sales.origin.as_str(), sales.version.as_str()),
        ("unit_id", "version")
    );
    assert!(sales.columns.iter().any(|c| c.kind == "array of text"));
    assert!(described
        .tables
        .iter()
        .all(|t| t.codec == "json" && !t.rule.is_empty()));
    assert!(schema.disagreements(&described).is_empty());
}

#[test]
fn a_description_that_is_not_whole_or_contradicts_itself_is_refused_in_words() {
    let described = whole::<written::Stock>().described();
    let with = |change: &dyn Fn(&mut crate::envelope::ReplicaSchema)| {
        let mut changed = described.clone();
        change(&mut changed);
        Schema::from_described(&changed)
            .expect_err("refused")
            .join("; ")
    };
    let table = |d: &mut crate::envelope::ReplicaSchema, name: &str| -> usize {
        d.tables.iter().position(|t| t.name == name).unwrap()
    };
    for (change, says) in [
        (
            Box::new(|d: &mut crate::envelope::ReplicaSchema| {
                let i = table(d, "orders");
                d.tables[i].codec.clear();
            }) as Box<dyn Fn(&mut crate::envelope::ReplicaSchema)>,
            "table `orders`: described without its codec",
        ),
        (
            Box::new(|d| {
                let i = table(d, "orders");
                d.tables[i].mirror = "sideways".into();
            }),
            "travels `sideways`",
        ),
        (
            Box::new(|d| {
                let i = table(d, "orders");
                d.tables[i].columns[0].kind = "i128".into();
            }),
            "of kind `i128`, which no build writes",
        ),
        (
            Box::new(|d| {
                let i = table(d, "stock");
                d.tables[i].owned = vec!["shelf".into()];
            }),
            "table `stock`: its owned column `shelf` is not among its columns",
        ),
        (
            Box::new(|d| {
                let i = table(d, "orders");
                d.tables[i].foreign_keys[0].parent = "clients".into();
            }),
            "points at table `clients`, which is not described",
        ),
        (
            Box::new(|d| {
                let i = table(d, "sales");
                d.tables[i].codec = "xml".into();
            }),
            "its codec `xml` is neither json nor protobuf",
        ),
        (
            Box::new(|d| {
                let i = table(d, "stock");
                d.tables[i].retired = "gone".into();
            }),
            "add up to the fingerprint",
        ),
    ] {
        let said = with(&*change);
        assert!(said.contains(says), "{said}");
    }
}

#[test]
fn a_build_that_owns_other_columns_than_the_server_says_which() {
    let server = whole::<written::Stock>().described();
    let build = whole::<written::StockOwnedOtherwise>();
    let said = build.disagreements(&server);
    assert_eq!(
        said,
        ["table `stock`: replicas own (counted) on the server, (on_hand) in this build"],
        "{said:?}"
    );
    // A server of an earlier build says nothing of it: nothing to
    // disagree on beyond columns, keys and directions.
    let mut earlier = server.clone();
    for t in &mut earlier.tables {
        t.codec.clear();
        t.owned.clear();
    }
    assert!(build.disagreements(&earlier).is_empty());
}
