#[derive(magic_sync::Row)]
#[row(down, all, key(region, number))]
struct Order {
    region: String,
    id: i64,
}

fn main() {}
