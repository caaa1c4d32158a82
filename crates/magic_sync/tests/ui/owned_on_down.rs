#[derive(magic_sync::Row)]
#[row(down, all, key(id))]
struct Order {
    id: i64,
    #[row(owned)]
    note: String,
}

fn main() {}
