use magic_sync::row::{Mirror, Row, Rule};

/// Every replica holds every row; table and schema named explicitly.
#[derive(magic_sync::Row)]
#[row(table = "units", schema = "catalog", down, all, key(id), codec = json)]
struct Unit {
    id: i32,
    name: String,
}

fn main() {
    assert_eq!(Unit::TABLE.mirror, Mirror::Down);
    assert_eq!(Unit::TABLE.rule, Rule::All);
}
