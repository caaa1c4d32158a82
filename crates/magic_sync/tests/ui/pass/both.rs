use magic_sync::row::{Mirror, Row};

#[derive(magic_sync::Row)]
#[row(both, replica = "unit_id", key(id), retired = "gone")]
struct Shelf {
    id: i64,
    unit_id: i32,
    #[row(owned)]
    label: Option<String>,
    #[row(owned)]
    facings: i16,
}

fn main() {
    assert_eq!(Shelf::TABLE.mirror, Mirror::Both);
    assert_eq!(Shelf::TABLE.owned, &["label", "facings"]);
}
