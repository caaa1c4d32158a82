#[derive(magic_sync::Row)]
#[row(both, replica = "unit_id", key(id))]
struct Shelf {
    id: i64,
    #[row(owned)]
    unit_id: String,
    #[row(owned)]
    label: String,
}

fn main() {}
