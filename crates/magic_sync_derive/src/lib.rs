//! `#[derive(Row)]` and `#[derive(Columns)]` for magic_sync.
//!
//! The derives read `#[row(...)]` attributes, check the declaration as a whole
//! (direction, rule, key, per-field roles) and write impls that name the
//! runtime crate by absolute paths (`::magic_sync::...`).

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput};

mod attrs;
mod check;
mod columns;
mod errors;
mod row;
mod shape;

/// Declares a table: implements `magic_sync::row::Columns` and `magic_sync::row::Row`.
///
/// The struct's fields are the columns replicas hold, in the order they are
/// declared; `#[row(..)]` on the struct says where the table lives, which
/// way its rows travel, which replicas hold which rows, and its key.
/// Foreign keys are never declared: the server reads them from its
/// catalogue and tells replicas. What only the database can tell (that the
/// table and columns exist with these types, the indexes below) is checked
/// when the relay starts; `magic_sync_cli::Indexes` prints the indexes it
/// would ask for. Everything else is checked here, with an error that
/// points at the attribute.
///
/// # Where, and the key
///
/// `table = ".."` and `schema = ".."` name the PostgreSQL table (defaults:
/// the struct's name in snake case, `public`); `key(..)` its key columns,
/// in the order notes and the wire use. Every table needs its key's index,
/// which its primary key is.
///
/// ```
/// use magic_sync::Row;
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "units", schema = "catalog", down, all, key(id))]
/// struct Unit {
///     id: i64,
///     name: String,
///     // NULL taken where the field is an Option.
///     note: Option<String>,
/// }
///
/// assert_eq!(Unit::TABLE.qualified(), r#""catalog"."units""#);
/// assert_eq!(Unit::TABLE.key, ["id"]);
/// ```
///
/// # Directions
///
/// - `down`: the server's rows, read-only on replicas.
/// - `up`: records replicas write. A field `#[row(origin)]` names the
///   replica that wrote a record (required), and is part of the key, so
///   two tills numbering their sales alike never meet; `key_without_origin`
///   says a key leaves it out on purpose (random ids, UUIDs). A field
///   `#[row(version)]` (at most one) is a number the replica raises on
///   every write, so an older write never overwrites a newer one. `lane =
///   ".."` sends the table on a lane of its own, so a table written all the
///   time never holds back the others. An up table has no rule: a record
///   stays with its replica.
/// - `both`: the server's rows, of which replicas own the fields marked
///   `#[row(owned)]` (at least one; never a key, rule or foreign-key
///   column): the server's writes overwrite the rest, replicas' writes of
///   the owned columns go up.
///
/// ```
/// use magic_sync::{Mirror, Numeric, Row};
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "sales", up, key(unit_id, number))]
/// struct Sale {
///     #[row(origin)]
///     unit_id: String,
///     number: i64,
///     total: Numeric,
///     #[row(version)]
///     version: i64,
/// }
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "readings", up, lane = "telemetry", key(id), key_without_origin)]
/// struct Reading {
///     id: String,
///     #[row(origin)]
///     unit_id: String,
///     value: f64,
/// }
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "stock", both, replica = "unit_id", key(unit_id, product_id))]
/// struct Stock {
///     unit_id: String,
///     product_id: i64,
///     on_hand: i32,
///     #[row(owned)]
///     counted: Option<i32>,
/// }
///
/// assert_eq!(Sale::TABLE.mirror, Mirror::Up);
/// assert_eq!(Sale::TABLE.origin, Some("unit_id"));
/// assert_eq!(Reading::TABLE.lane, Some("telemetry"));
/// assert_eq!(Stock::TABLE.owned, ["counted"]);
/// ```
///
/// # Rules: which replicas hold which rows
///
/// A `down` or `both` table has exactly one.
///
/// - `all`: every replica holds every row.
/// - `replica = "col"`: rows whose column equals the replica's id.
/// - `partition = "col"`: rows whose column equals the replica's
///   partition (a region, a store).
/// - `referenced`: no rule of its own; a row travels only as the parent of
///   a row a replica holds, and is taken back when nothing it holds points
///   at it.
///
/// None of these needs an index beyond the key.
///
/// ```
/// use magic_sync::{Row, Rule};
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "products", down, all, key(id))]
/// struct Product { id: i64, name: String }
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "orders", down, replica = "unit_id", key(id))]
/// struct Order { id: i64, unit_id: String, customer_id: Option<i64> }
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "notices", down, partition = "region", key(id))]
/// struct Notice { id: i64, region: String, body: String }
///
/// // Sent with the orders that point at it.
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "customers", down, referenced, key(id))]
/// struct Customer { id: i64, name: String }
///
/// assert_eq!(Order::TABLE.rule, Rule::Replica("unit_id"));
/// assert_eq!(Notice::TABLE.rule, Rule::Partition("region"));
/// assert_eq!(Customer::TABLE.rule, Rule::Referenced);
/// ```
///
/// `follows = "col[, col]"`: a row travels with its parent, which these
/// columns point at (a foreign key in the database): an order's lines go
/// where the order goes. The relay finds a parent's rows by these columns,
/// so the child needs an index that leads with them, here
/// `CREATE INDEX ON order_lines (order_id)`. Declare the parent too.
///
/// ```
/// use magic_sync::{Row, Rule};
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "order_lines", down, follows = "order_id", key(order_id, line_no))]
/// struct OrderLine { order_id: i64, line_no: i32, product_id: i64, qty: i32 }
///
/// assert_eq!(OrderLine::TABLE.rule, Rule::Follows(&["order_id"]));
/// ```
///
/// `group(members = "..", member = "..", grants = "..", replica = "..",
/// group = "..")`: rows given through groups. The members table lists which
/// rows belong to which group (`member`: its columns pointing at this
/// table's key, in key order, comma-separated); the grants table lists
/// which group is given to which replica (`replica`: its column naming the
/// replica). The group column carries the same name in both (`group`,
/// default `group_id`). Neither table is declared: they stay on the server,
/// and the relay reads them. It needs three indexes, each leading with:
/// the members' `member` columns (a row's groups), the members' group
/// column (a group's rows), and the grants' replica column then group
/// column (whether a replica has a group). A primary key counts: here
/// `PRIMARY KEY (group_id, promotion_id)` on the members and
/// `PRIMARY KEY (unit_id, group_id)` on the grants leave one to make,
/// `CREATE INDEX ON promotion_members (promotion_id)`.
///
/// ```
/// use magic_sync::{Row, Rule};
///
/// #[derive(Row, Debug, Clone)]
/// #[row(
///     table = "promotions",
///     down,
///     group(
///         members = "promotion_members",
///         member = "promotion_id",
///         grants = "unit_groups",
///         replica = "unit_id"
///     ),
///     key(id)
/// )]
/// struct Promotion { id: i64, product_id: i64, discount: i32 }
///
/// let Rule::Group(group) = Promotion::TABLE.rule else { unreachable!() };
/// assert_eq!((group.members, group.group, group.grants), ("promotion_members", "group_id", "unit_groups"));
/// ```
///
/// # Rows kept for the replica's own records
///
/// `retired = "col"` names a column the replica adds to its copy of the
/// table (not a field, not on the server): a row the server takes back
/// while one of the replica's own records (a row of an up table) still
/// points at it is kept with this column set, and purged once nothing
/// points at it. A sale keeps its customer.
///
/// ```
/// use magic_sync::Row;
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "customers", down, referenced, key(id), retired = "retired")]
/// struct Customer { id: i64, name: String }
///
/// assert_eq!(Customer::TABLE.retired, Some("retired"));
/// ```
///
/// # Codecs
///
/// Rows travel as JSON by default (`codec = json`). `codec =
/// protobuf(Msg)` sends them as the prost message `Msg`, through a
/// `magic_sync::codec::ProtoMapping<Msg>` the host writes.
///
/// ```
/// use magic_sync::codec::ProtoMapping;
/// use magic_sync::Row;
///
/// #[derive(Clone, PartialEq, prost::Message)]
/// struct UnitPb {
///     #[prost(int64, tag = "1")]
///     id: i64,
///     #[prost(string, tag = "2")]
///     name: String,
/// }
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "units", down, all, key(id), codec = protobuf(UnitPb))]
/// struct Unit { id: i64, name: String }
///
/// impl ProtoMapping<UnitPb> for Unit {
///     fn to_proto(&self) -> UnitPb {
///         UnitPb { id: self.id, name: self.name.clone() }
///     }
///     fn from_proto(m: UnitPb) -> Result<Self, String> {
///         Ok(Unit { id: m.id, name: m.name })
///     }
/// }
///
/// assert_eq!(Unit::codec().format(), "protobuf");
/// ```
///
/// # The engine
///
/// The tables a build declares go into one `magic_sync::Engine`, which
/// checks them together: no table declared twice, no group table of a rule
/// also declared, a stamp only on a table replicas write. Server and
/// replicas are given the same one. A stamp (`Builder::stamp`) writes what
/// the server knows of a sender into every row it uploads to that table,
/// before the row is filed, or refuses the row: the replica's id comes from
/// the transport, never from the row.
///
/// ```
/// use magic_sync::{Engine, Row};
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "orders", down, replica = "unit_id", key(id))]
/// struct Order { id: i64, unit_id: String }
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "order_lines", down, follows = "order_id", key(order_id, line_no))]
/// struct OrderLine { order_id: i64, line_no: i32, qty: i32 }
///
/// #[derive(Row, Debug, Clone)]
/// #[row(table = "sales", up, key(unit_id, number))]
/// struct Sale {
///     #[row(origin)]
///     unit_id: String,
///     number: i64,
///     store: Option<String>,
/// }
///
/// let engine = Engine::builder()
///     .table::<Order>()
///     .table::<OrderLine>()
///     .table::<Sale>()
///     .stamp::<Sale>(|replica, row| {
///         // Tills are named `store/till`: the store is the host's to say.
///         let store = replica.split('/').next().ok_or("a till of no store")?;
///         row.insert("store".into(), store.into());
///         Ok(())
///     })
///     .build()
///     .expect("the declarations agree with each other");
/// assert_eq!(engine.tables().count(), 3);
/// ```
#[proc_macro_derive(Row, attributes(row))]
pub fn derive_row(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    row::expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Implements `magic_sync::row::Columns` for a struct whose fields are columns.
#[proc_macro_derive(Columns, attributes(row))]
pub fn derive_columns(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    columns::expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
