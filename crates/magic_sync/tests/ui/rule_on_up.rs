#[derive(magic_sync::Row)]
#[row(up, replica = "origin_id", key(id), key_without_origin)]
struct Sale {
    id: i64,
    #[row(origin)]
    origin_id: String,
}

fn main() {}
