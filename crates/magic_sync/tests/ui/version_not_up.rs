#[derive(magic_sync::Row)]
#[row(both, all, key(id))]
struct Order {
    id: i64,
    #[row(version)]
    revision: i64,
    #[row(owned)]
    note: String,
}

fn main() {}
