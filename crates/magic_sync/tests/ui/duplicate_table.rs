#[derive(magic_sync::Row)]
#[row(down, all, key(id), table = "orders")]
#[row(table = "order")]
struct Order {
    id: i64,
}

fn main() {}
