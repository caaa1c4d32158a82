#[derive(magic_sync::Row)]
#[row(both, all, key(id))]
struct Shelf {
    #[row(owned)]
    id: i64,
    label: String,
}

fn main() {}
