#[derive(magic_sync::Row)]
#[row(both, all, key(id))]
struct Shelf {
    id: i64,
    label: String,
}

fn main() {}
