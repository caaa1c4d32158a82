#[derive(magic_sync::Row)]
#[row(down, all, key(id))]
struct Order {
    id: i64,
    #[row(origin)]
    origin_id: String,
}

fn main() {}
