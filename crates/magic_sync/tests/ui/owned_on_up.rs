#[derive(magic_sync::Row)]
#[row(up, key(id), key_without_origin)]
struct Sale {
    id: i64,
    #[row(origin)]
    origin_id: String,
    #[row(owned)]
    note: String,
}

fn main() {}
