#[derive(magic_sync::Row)]
#[row(down, all, key(id))]
struct Order {
    #[row(primary)]
    id: i64,
}

fn main() {}
